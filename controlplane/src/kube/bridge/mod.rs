//! The bridge: a kube-runtime controller over `LogicVolume` that carries
//! each object out on its node through `NodeStorage` over mutual TLS
//! (`run_controller`; [`super::bridge_side::run`] runs it together with
//! the capacity publisher and the config push).
//!
//! **Apply** (the object holds [`LOGICVOLUME_FINALIZER`]; the
//! `finalizer()` helper adds it when missing): when `status.volumeID` is
//! unset, `CreateLV` (name = object name, `spec.deviceGroup`, `spec.size`
//! in bytes, exclusive when [`carina_api::EXCLUSIVE_ANNOTATION`] is `"true"`); when
//! `spec.size` exceeds `status.currentSize`, `ResizeLV`. The node is
//! `spec.nodeName`, reached at the endpoint [`Nodes`] resolves (or the
//! object's own [`carina_api::NODE_ENDPOINT_ANNOTATION`]). The call continues the
//! trace of the [`carina_api::TRACEPARENT_ANNOTATION`].
//!
//! **Status** is written by server-side apply on the status subresource,
//! field manager [`FIELD_MANAGER`], always whole (so a failure keeps the
//! volume fields): on success `volumeID`, `currentSize`,
//! `deviceMajor`/`Minor` (block volumes), `status: Success`, `code: 0`,
//! condition `Ready=True`; on failure `status: Failed`, `code` (the gRPC
//! code), `message`, `Ready=False` with the code's name as reason, and a
//! Warning Event on the object. `observedGeneration` is the generation
//! acted on.
//!
//! **Retries** ([`error_policy`]; the classes of a node's answer are
//! [`carina_api::state::Retry`], the rule the provisioner and the
//! scheduler read too): `UNAVAILABLE`, `DEADLINE_EXCEEDED`, `ABORTED`,
//! `CANCELLED` and API errors are retried soon, with a per-object
//! exponential backoff ([`Backoff`]). `INVALID_ARGUMENT`,
//! `ALREADY_EXISTS`, `RESOURCE_EXHAUSTED` and `OUT_OF_RANGE` are terminal:
//! the provisioner reads the code, and the bridge does not try the same
//! generation again (a change of the spec does). Other codes (`INTERNAL`,
//! `FAILED_PRECONDITION`, `PERMISSION_DENIED`, ...) are retried slowly,
//! except a delete the node refuses with `FAILED_PRECONDITION` (the volume
//! is still in use, typically while the kubelet unstages it): that one is
//! retried soon, with the backoff.
//!
//! **Cleanup**: `DeleteLV` on the node. Success or `NOT_FOUND` (or a name
//! the node calls invalid, which no volume can have) releases the
//! finalizer; any other error keeps it, is written to the status and
//! retried. A `LogicVolume` whose Node object no longer exists is
//! released with a Warning Event: there is no node left to delete on.
//!
//! **Go Carina's objects** ([`LogicVolume::owner`]): one not taken over
//! is left alone (no node call, no Ready, its finalizer neither added nor
//! removed) but for the condition [`ADOPTED`] `False`; one taken over is
//! first found on its node (`GetLV`, never `CreateLV`), then reconciled
//! like ours under its node-local name, the Go id (`takeover`).
//!
//! **Files.** This one runs the controller (`run_controller`, `reconcile`,
//! [`error_policy`]); `decide` holds the pure decisions (which operation,
//! terminal or not, the status to write); `steps` carries them out on the
//! node and in the API; `context` holds what every reconcile shares and its
//! API calls; `error` is [`Error`] and its retry classes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use carina_api::{LOGICVOLUME_FINALIZER, LogicVolume};
use futures::StreamExt;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tracing::Instrument;

use super::endpoints::{Nodes, stopped};
use super::retry::Backoff;
use crate::nodes::pool::NodeClients;

mod context;
mod decide;
mod error;
mod steps;
mod takeover;

use context::Context;
pub use context::FIELD_MANAGER;
pub use decide::READY;
pub use error::Error;
use error::Retry;
use steps::{apply, cleanup};
use takeover::Route;
pub use takeover::{ADOPTED, BAD_ADOPTION, GO_CARINA_VOLUME};

/// `reportingController` of the bridge's Events.
pub const REPORTER: &str = "carina-bridge";

async fn reconcile(lv: Arc<LogicVolume>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = lv.name_any();
    let started = std::time::Instant::now();
    let span = tracing::info_span!("bridge.reconcile", carina.volume.name = %name);
    let result = match takeover::route(&lv) {
        Route::LeaveAlone { reason, message } => {
            takeover::leave_alone(&lv, &ctx, reason, &message)
                .instrument(span)
                .await
        }
        Route::Confirm { local } => takeover::confirm(&lv, &ctx, &local).instrument(span).await,
        Route::Reconcile { local } => {
            finalizer(&ctx.lvs, LOGICVOLUME_FINALIZER, lv, |event| async {
                match event {
                    FinalizerEvent::Apply(lv) => apply(&lv, &ctx, &local).await,
                    FinalizerEvent::Cleanup(lv) => cleanup(&lv, &ctx, &local).await,
                }
            })
            .instrument(span)
            .await
            .map_err(|e| Error::Finalizer(Box::new(e)))
        }
    };
    if result.is_ok() {
        ctx.failures().remove(&name);
    }
    let outcome = match &result {
        Ok(_) => "OK",
        Err(e) => e.code().map_or("KUBE_API", carina_proto::code_name),
    };
    crate::metrics::metrics().reconciled(outcome, started.elapsed());
    result
}

/// The requeue after a failed reconcile, by the error's kind.
fn error_policy(lv: Arc<LogicVolume>, error: &Error, ctx: Arc<Context>) -> Action {
    let name = lv.name_any();
    let action = match error.retry() {
        Retry::Never if !error.is_cleanup() => {
            tracing::info!(carina.volume.name = %name, error = %error, "terminal failure; not retried until the spec changes");
            return Action::await_change();
        }
        Retry::Never | Retry::Later => ctx.slow_retry,
        Retry::Soon => {
            let mut failures = ctx.failures();
            let attempt = failures.entry(name.clone()).or_insert(0);
            let delay = ctx.retry.delay(*attempt);
            *attempt = attempt.saturating_add(1);
            delay
        }
    };
    tracing::warn!(carina.volume.name = %name, error = %error, retry_in = ?action, "reconcile failed");
    Action::requeue(action)
}

/// What the `LogicVolume` controller takes from
/// [`super::bridge_side::BridgeConfig`].
#[derive(Debug, Clone)]
pub(crate) struct ControllerConfig {
    /// `LogicVolume`s reconciled at once.
    pub concurrency: u16,
    /// Retries after transient errors.
    pub retry: Backoff,
    /// Retry interval after errors that are neither transient nor
    /// terminal.
    pub slow_retry: Duration,
    /// `reportingInstance` of the Events.
    pub instance: Option<String>,
}

/// Runs the `LogicVolume` controller until `stop` turns true; in-flight
/// reconciles finish first.
pub(crate) async fn run_controller(
    client: Client,
    nodes: Nodes,
    clients: Arc<NodeClients>,
    config: &ControllerConfig,
    mut stop: watch::Receiver<bool>,
) {
    let lvs: Api<LogicVolume> = Api::all(client.clone());
    let reporter = Reporter {
        controller: REPORTER.to_string(),
        instance: config.instance.clone(),
    };
    let ctx = Arc::new(Context {
        lvs: lvs.clone(),
        nodes,
        clients,
        recorder: Recorder::new(client, reporter),
        retry: config.retry,
        slow_retry: config.slow_retry,
        failures: Mutex::new(HashMap::new()),
    });
    Controller::new(lvs, watcher::Config::default())
        .with_config(controller::Config::default().concurrency(config.concurrency))
        .graceful_shutdown_on(async move { stopped(&mut stop).await })
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok(_) => {}
                // Logged by the error policy.
                Err(controller::Error::ReconcilerFailed(..)) => {}
                Err(controller::Error::ObjectNotFound(r)) => {
                    tracing::debug!(object = %r, "reconcile of an object already gone")
                }
                Err(e) => tracing::warn!(error = %e, "LogicVolume controller"),
            }
        })
        .await;
}
