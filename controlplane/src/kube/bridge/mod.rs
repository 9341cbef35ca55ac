//! The bridge: a kube-runtime controller over `LogicVolume` that carries
//! each object out on its node through `NodeStorage` over mutual TLS
//! (`run_controller`; [`super::bridge_side::run`] runs it together with
//! the capacity publisher and the config push).
//!
//! **Apply** (the object holds [`LOGICVOLUME_FINALIZER`]; the
//! `finalizer()` helper adds it when missing): when `status.volumeID` is
//! unset, `CreateLV` (name = object name, `spec.deviceGroup`, `spec.size`
//! in bytes, exclusive when [`EXCLUSIVE_ANNOTATION`] is `"true"`); when
//! `spec.size` exceeds `status.currentSize`, `ResizeLV`. The node is
//! `spec.nodeName`, reached at the endpoint [`Nodes`] resolves (or the
//! object's own [`NODE_ENDPOINT_ANNOTATION`]). The call continues the
//! trace of the [`TRACEPARENT_ANNOTATION`].
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
//! **Retries** ([`error_policy`]): `UNAVAILABLE`, `DEADLINE_EXCEEDED`,
//! `ABORTED` and API errors are retried soon, with a per-object
//! exponential backoff ([`Backoff`]). `INVALID_ARGUMENT`,
//! `ALREADY_EXISTS`, `RESOURCE_EXHAUSTED` and `OUT_OF_RANGE` are terminal:
//! the provisioner reads the code, and the bridge does not try the same
//! generation again (a change of the spec does). Other codes (`INTERNAL`,
//! `FAILED_PRECONDITION`, `PERMISSION_DENIED`, ...) are retried slowly.
//!
//! **Cleanup**: `DeleteLV` on the node. Success or `NOT_FOUND` (or a name
//! the node calls invalid, which no volume can have) releases the
//! finalizer; any other error keeps it, is written to the status and
//! retried. A `LogicVolume` whose Node object no longer exists is
//! released with a Warning Event: there is no node left to delete on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use carina_csi::CsiError;
use carina_csi::volume_id::VolumeId;
use carina_proto::code_name;
use carina_proto::nodestorage as pb;
use carina_proto::tls::TlsError;
use futures::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{self, Event as FinalizerEvent, finalizer};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::watch;
use tonic::Code;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::endpoints::{EndpointError, NodeEndpoint, Nodes, annotated_endpoint, stopped};
use super::retry::Backoff;
use super::status::{condition, truncate};
use crate::nodes::pool::NodeClients;
use carina_api::logicvolume::{STATUS_FAILED, STATUS_SUCCESS};
use carina_api::quantity::{bytes_quantity, quantity_bytes};
use carina_api::{
    EXCLUSIVE_ANNOTATION, LOGICVOLUME_FINALIZER, LogicVolume, LogicVolumeStatus,
    NODE_ENDPOINT_ANNOTATION, TRACEPARENT_ANNOTATION,
};

/// Field manager of the bridge's status writes.
pub const FIELD_MANAGER: &str = "carina-bridge";

/// `reportingController` of the bridge's Events.
pub const REPORTER: &str = "carina-bridge";

/// The condition type the bridge maintains.
pub const READY: &str = "Ready";

/// Longest Event note the API accepts (1 kB).
const MAX_NOTE: usize = 1024;

/// Why a `LogicVolume` (or [`super::bridge_side::run`]) failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A field of the object is unusable.
    #[error("{field}: {reason}")]
    Spec { field: &'static str, reason: String },
    /// The node's endpoint cannot be told.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// The node answered with an error or could not be reached.
    #[error(transparent)]
    Node(CsiError),
    /// Writing the object's status failed.
    #[error("write the status of LogicVolume {name}: {source}")]
    Status {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// Adding or removing the finalizer failed, or the step inside did.
    #[error(transparent)]
    Finalizer(Box<finalizer::Error<Error>>),
    /// The client TLS material does not make a client configuration.
    #[error("TLS client configuration: {0}")]
    Tls(#[from] TlsError),
}

/// How soon an error is worth trying again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Transient: with the per-object backoff.
    Soon,
    /// Unlikely to change by itself: every `slow_retry`.
    Later,
    /// The request itself is wrong: not again for this generation.
    Never,
}

fn retry_of(code: Code) -> Retry {
    match code {
        Code::Unavailable | Code::DeadlineExceeded | Code::Aborted | Code::Cancelled => Retry::Soon,
        Code::InvalidArgument
        | Code::AlreadyExists
        | Code::ResourceExhausted
        | Code::OutOfRange => Retry::Never,
        _ => Retry::Later,
    }
}

impl Error {
    /// The gRPC code written to `status.code` for this error; `None` for
    /// errors of the Kubernetes API, which are not the node's answer.
    pub fn code(&self) -> Option<Code> {
        match self {
            Error::Spec { .. } => Some(Code::InvalidArgument),
            Error::Endpoint(_) => Some(Code::Unavailable),
            Error::Node(e) => Some(e.code()),
            Error::Finalizer(e) => match &**e {
                finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e.code(),
                _ => None,
            },
            Error::Status { .. } | Error::Tls(_) => None,
        }
    }

    fn retry(&self) -> Retry {
        match self {
            Error::Endpoint(EndpointError::Api { .. }) => Retry::Soon,
            Error::Endpoint(_) => Retry::Later,
            Error::Finalizer(e) => match &**e {
                finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e.retry(),
                finalizer::Error::AddFinalizer(_) | finalizer::Error::RemoveFinalizer(_) => {
                    Retry::Soon
                }
                _ => Retry::Later,
            },
            Error::Status { .. } => Retry::Soon,
            _ => self.code().map_or(Retry::Soon, retry_of),
        }
    }

    fn is_cleanup(&self) -> bool {
        matches!(self, Error::Finalizer(e) if matches!(**e, finalizer::Error::CleanupFailed(_)))
    }
}

/// Makes `span` a child of the W3C `traceparent` (ignored when
/// malformed, or when no OpenTelemetry layer is installed).
fn continue_trace(span: &tracing::Span, traceparent: &str) {
    let mut headers = http::HeaderMap::new();
    if let Ok(value) = http::HeaderValue::from_str(traceparent) {
        headers.insert("traceparent", value);
        let _ = span.set_parent(carina_proto::trace::extract(&headers));
    }
}

/// The node operations of the bridge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Create,
    Resize,
    Delete,
}

impl Op {
    fn rpc(self) -> &'static str {
        match self {
            Op::Create => "CreateLV",
            Op::Resize => "ResizeLV",
            Op::Delete => "DeleteLV",
        }
    }

    fn failed_reason(self) -> &'static str {
        match self {
            Op::Create => "CreateFailed",
            Op::Resize => "ResizeFailed",
            Op::Delete => "DeleteFailed",
        }
    }
}

/// What every reconcile shares.
struct Context {
    lvs: Api<LogicVolume>,
    nodes: Nodes,
    clients: Arc<NodeClients>,
    recorder: Recorder,
    retry: Backoff,
    slow_retry: Duration,
    /// Consecutive soon-retried failures per object, for the backoff.
    failures: Mutex<HashMap<String, u32>>,
}

impl Context {
    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        // A counter map cannot be left half-changed.
        self.failures.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn event(
        &self,
        lv: &LogicVolume,
        type_: EventType,
        reason: &str,
        action: Op,
        note: &str,
    ) {
        let event = KubeEvent {
            type_,
            reason: reason.to_string(),
            note: Some(truncate(note, MAX_NOTE)),
            action: action.rpc().to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &lv.object_ref(&())).await {
            tracing::warn!(volume.name = %lv.name_any(), error = %e, "publishing an Event failed");
        }
    }

    async fn write_status(&self, name: &str, status: &LogicVolumeStatus) -> Result<(), Error> {
        let patch = serde_json::json!({
            "apiVersion": LogicVolume::api_version(&()),
            "kind": LogicVolume::kind(&()),
            "status": status,
        });
        match self
            .lvs
            .patch_status(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            // Deleted meanwhile: nobody is left to read it.
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(source) => Err(Error::Status {
                name: name.to_string(),
                source,
            }),
        }
    }

    /// The node of `lv` and where to reach it.
    async fn endpoint(&self, lv: &LogicVolume) -> Result<NodeEndpoint, EndpointError> {
        let node = &lv.spec.node_name;
        if let Some(value) = lv.annotations().get(NODE_ENDPOINT_ANNOTATION) {
            return Ok(NodeEndpoint {
                endpoint: annotated_endpoint(node, value)?,
                node: node.clone(),
            });
        }
        self.nodes.resolve_fresh(node).await
    }
}

/// A span for one node call of `lv`, continuing its trace.
fn node_span(lv: &LogicVolume, op: Op) -> tracing::Span {
    let span = tracing::info_span!(
        "bridge.node_call",
        otel.name = %format!("bridge {}", op.rpc()),
        volume.name = %lv.name_any(),
        node.name = %lv.spec.node_name,
        volume.group = %lv.spec.device_group,
    );
    if let Some(traceparent) = lv.annotations().get(TRACEPARENT_ANNOTATION) {
        continue_trace(&span, traceparent);
    }
    span
}

/// True when the last attempt at this generation ended with a terminal
/// code: the provisioner has it, and only a new spec is worth a retry.
fn failed_for_good(lv: &LogicVolume) -> bool {
    let Some(status) = &lv.status else {
        return false;
    };
    status.status.as_deref() == Some(STATUS_FAILED)
        && status.observed_generation.is_some()
        && status.observed_generation == lv.metadata.generation
        && status
            .code
            .is_some_and(|c| retry_of(Code::from_i32(c)) == Retry::Never)
}

async fn reconcile(lv: Arc<LogicVolume>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = lv.name_any();
    let result = finalizer(&ctx.lvs, LOGICVOLUME_FINALIZER, lv, |event| async {
        match event {
            FinalizerEvent::Apply(lv) => apply(&lv, &ctx).await,
            FinalizerEvent::Cleanup(lv) => cleanup(&lv, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    if result.is_ok() {
        ctx.failures().remove(&name);
    }
    result
}

/// The requeue after a failed reconcile, by the error's kind.
fn error_policy(lv: Arc<LogicVolume>, error: &Error, ctx: Arc<Context>) -> Action {
    let name = lv.name_any();
    let action = match error.retry() {
        Retry::Never if !error.is_cleanup() => {
            tracing::info!(volume.name = %name, error = %error, "terminal failure; not retried until the spec changes");
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
    tracing::warn!(volume.name = %name, error = %error, retry_in = ?action, "reconcile failed");
    Action::requeue(action)
}

/// Writes the failure to the status, publishes a Warning Event, and
/// hands `error` to the error policy.
async fn fail(lv: &LogicVolume, ctx: &Context, op: Op, error: Error) -> Result<Action, Error> {
    let code = error.code().unwrap_or(Code::Unknown);
    let message = error.to_string();
    let previous = lv.status.clone().unwrap_or_default();
    let status = LogicVolumeStatus {
        code: Some(code as i32),
        message: Some(message.clone()),
        status: Some(STATUS_FAILED.to_string()),
        conditions: vec![condition(
            &previous.conditions,
            READY,
            false,
            code_name(code),
            &message,
            lv.metadata.generation,
        )],
        observed_generation: lv.metadata.generation,
        ..previous
    };
    ctx.event(
        lv,
        EventType::Warning,
        op.failed_reason(),
        op,
        &format!("{}: {message}", code_name(code)),
    )
    .await;
    ctx.write_status(&lv.name_any(), &status).await?;
    Err(error)
}

async fn apply(lv: &LogicVolume, ctx: &Context) -> Result<Action, Error> {
    if failed_for_good(lv) {
        return Ok(Action::await_change());
    }
    let name = lv.name_any();
    let previous = lv.status.clone().unwrap_or_default();
    let op = if previous.volume_id.is_none() {
        Op::Create
    } else {
        Op::Resize
    };
    if lv.spec.node_name.is_empty() {
        let e = Error::Spec {
            field: "spec.nodeName",
            reason: "empty".into(),
        };
        return fail(lv, ctx, op, e).await;
    }
    let wanted = match quantity_bytes(&lv.spec.size) {
        Ok(b) => b,
        Err(e) => {
            let e = Error::Spec {
                field: "spec.size",
                reason: e.to_string(),
            };
            return fail(lv, ctx, op, e).await;
        }
    };
    if op == Op::Resize {
        let current = previous
            .current_size
            .as_ref()
            .and_then(|q| quantity_bytes(q).ok());
        if current.is_some_and(|c| c >= wanted) {
            return settled(lv, ctx, previous).await;
        }
    }
    let endpoint = match ctx.endpoint(lv).await {
        Ok(e) => e,
        Err(e) => return fail(lv, ctx, op, e.into()).await,
    };
    let clients = &ctx.clients;
    let result = async {
        match op {
            Op::Create => {
                let req = pb::CreateLvRequest {
                    name: name.clone(),
                    device_group: lv.spec.device_group.clone(),
                    size_bytes: wanted,
                    exclusive: lv
                        .annotations()
                        .get(EXCLUSIVE_ANNOTATION)
                        .is_some_and(|v| v == "true"),
                };
                let what = format!("CreateLV {name}");
                clients
                    .call(
                        &endpoint,
                        &what,
                        |mut c| async move { c.create_lv(req).await },
                    )
                    .await
                    .map(|r| r.volume)
            }
            _ => {
                let req = pb::ResizeLvRequest {
                    name: name.clone(),
                    size_bytes: wanted,
                };
                let what = format!("ResizeLV {name}");
                clients
                    .call(
                        &endpoint,
                        &what,
                        |mut c| async move { c.resize_lv(req).await },
                    )
                    .await
                    .map(|r| r.volume)
            }
        }
    }
    .instrument(node_span(lv, op))
    .await;
    let volume = match result {
        Ok(Some(v)) => v,
        Ok(None) => {
            let e = CsiError::Internal(format!(
                "node {}: {} {name} answered without a volume",
                endpoint.node,
                op.rpc()
            ));
            return fail(lv, ctx, op, Error::Node(e)).await;
        }
        Err(e) => return fail(lv, ctx, op, Error::Node(e)).await,
    };
    let message = format!(
        "{} bytes in device group {} on node {}",
        volume.size_bytes, volume.device_group, endpoint.node
    );
    let block = !volume.device_path.is_empty();
    let status = LogicVolumeStatus {
        volume_id: Some(VolumeId::new(name.clone(), lv.spec.node_name.clone()).encode()),
        code: Some(0),
        message: Some(message.clone()),
        current_size: Some(bytes_quantity(volume.size_bytes)),
        status: Some(STATUS_SUCCESS.to_string()),
        device_major: block.then_some(volume.major),
        device_minor: block.then_some(volume.minor),
        conditions: vec![condition(
            &previous.conditions,
            READY,
            true,
            "Provisioned",
            &message,
            lv.metadata.generation,
        )],
        observed_generation: lv.metadata.generation,
        // One status write carries everything: a second request right
        // after it would wait on a delayed ACK.
        path: Some(if block {
            volume.device_path.clone()
        } else {
            volume.host_path.clone()
        })
        .filter(|p| !p.is_empty()),
    };
    ctx.write_status(&name, &status).await?;
    let (reason, what) = match op {
        Op::Create => ("Created", "created"),
        _ => ("Resized", "resized"),
    };
    tracing::info!(volume.name = %name, node.name = %endpoint.node, bytes = volume.size_bytes, "volume {what}");
    ctx.event(
        lv,
        EventType::Normal,
        reason,
        op,
        &format!("volume {what}: {message}"),
    )
    .await;
    Ok(Action::await_change())
}

/// Nothing to do on the node: record that this generation is done (after
/// a failed resize whose size was taken back, or a change of other spec
/// fields).
async fn settled(
    lv: &LogicVolume,
    ctx: &Context,
    previous: LogicVolumeStatus,
) -> Result<Action, Error> {
    if previous.status.as_deref() == Some(STATUS_SUCCESS)
        && previous.observed_generation == lv.metadata.generation
    {
        return Ok(Action::await_change());
    }
    let message = "volume ready".to_string();
    let status = LogicVolumeStatus {
        code: Some(0),
        message: Some(message.clone()),
        status: Some(STATUS_SUCCESS.to_string()),
        conditions: vec![condition(
            &previous.conditions,
            READY,
            true,
            "Provisioned",
            &message,
            lv.metadata.generation,
        )],
        observed_generation: lv.metadata.generation,
        ..previous
    };
    ctx.write_status(&lv.name_any(), &status).await?;
    Ok(Action::await_change())
}

async fn cleanup(lv: &LogicVolume, ctx: &Context) -> Result<Action, Error> {
    let name = lv.name_any();
    let endpoint = match ctx.endpoint(lv).await {
        Ok(e) => e,
        Err(EndpointError::NoNode { node }) => {
            let note = format!(
                "node {node:?} has no Node object: nothing left to delete the volume on; releasing the object"
            );
            tracing::warn!(volume.name = %name, node.name = %node, "{note}");
            ctx.event(lv, EventType::Warning, "NodeGone", Op::Delete, &note)
                .await;
            return Ok(Action::await_change());
        }
        Err(e) => return fail(lv, ctx, Op::Delete, e.into()).await,
    };
    let req = pb::DeleteLvRequest { name: name.clone() };
    let what = format!("DeleteLV {name}");
    let result = ctx
        .clients
        .call(
            &endpoint,
            &what,
            |mut c| async move { c.delete_lv(req).await },
        )
        .instrument(node_span(lv, Op::Delete))
        .await;
    match result {
        Ok(_) => {
            tracing::info!(volume.name = %name, node.name = %endpoint.node, "volume deleted");
            let note = format!("volume deleted on node {}", endpoint.node);
            ctx.event(lv, EventType::Normal, "Deleted", Op::Delete, &note)
                .await;
            Ok(Action::await_change())
        }
        // No such volume, or a name no volume can have: nothing to delete.
        Err(e) if matches!(e.code(), Code::NotFound | Code::InvalidArgument) => {
            tracing::info!(volume.name = %name, node.name = %endpoint.node, reason = %e, "no volume to delete");
            Ok(Action::await_change())
        }
        Err(e) => fail(lv, ctx, Op::Delete, Error::Node(e)).await,
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    #[test]
    fn retry_classes() {
        for code in [Code::Unavailable, Code::DeadlineExceeded, Code::Aborted] {
            assert_eq!(retry_of(code), Retry::Soon, "{code:?}");
        }
        for code in [
            Code::ResourceExhausted,
            Code::InvalidArgument,
            Code::AlreadyExists,
        ] {
            assert_eq!(retry_of(code), Retry::Never, "{code:?}");
        }
        for code in [Code::Internal, Code::FailedPrecondition, Code::Unknown] {
            assert_eq!(retry_of(code), Retry::Later, "{code:?}");
        }
        let cleanup = Error::Finalizer(Box::new(finalizer::Error::CleanupFailed(Error::Node(
            CsiError::ResourceExhausted("x".into()),
        ))));
        assert!(cleanup.is_cleanup());
        assert_eq!(cleanup.code(), Some(Code::ResourceExhausted));
    }

    #[test]
    fn terminal_failures_wait_for_a_new_generation() {
        let mut lv = LogicVolume::new(
            "v",
            carina_api::LogicVolumeSpec {
                node_name: "n".into(),
                size: Quantity("1Gi".into()),
                device_group: "g".into(),
                pvc: String::new(),
                name_space: String::new(),
            },
        );
        lv.metadata.generation = Some(3);
        lv.status = Some(LogicVolumeStatus {
            code: Some(Code::ResourceExhausted as i32),
            status: Some(STATUS_FAILED.into()),
            observed_generation: Some(3),
            ..LogicVolumeStatus::default()
        });
        assert!(failed_for_good(&lv));
        lv.metadata.generation = Some(4);
        assert!(!failed_for_good(&lv));
        lv.metadata.generation = Some(3);
        if let Some(s) = lv.status.as_mut() {
            s.code = Some(Code::Unavailable as i32);
        }
        assert!(!failed_for_good(&lv));
    }
}
