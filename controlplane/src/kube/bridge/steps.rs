//! The reconcile steps carried out: [`apply`] (`CreateLV`, then `CopyLV`
//! for a volume filled from another, `CreateBcache` for a tiered volume,
//! or `ResizeLV` on the node, then the status and an
//! Event), [`cleanup`] (`DeleteLV` or `DeleteBcache`), and
//! [`fail`] (the failure into the status and a Warning Event). Each node
//! call runs in a span that continues the object's trace. What to do and
//! what to write comes from `decide`.

use carina_api::{EXCLUSIVE_ANNOTATION, LogicVolume, TRACEPARENT_ANNOTATION};
use carina_csi::CsiError;
use carina_proto::code_name;
use carina_proto::nodestorage as pb;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tonic::Code;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::context::Context;
use super::decide::{
    Op, Plan, bcache_volume, failed_status, made_status, nothing_to_delete, plan, settled_status,
};
use super::error::Error;
use crate::kube::endpoints::{EndpointError, NodeEndpoint};
use crate::nodes::copy::copy;

/// Makes `span` a child of the W3C `traceparent` (ignored when
/// malformed, or when no OpenTelemetry layer is installed).
fn continue_trace(span: &tracing::Span, traceparent: &str) {
    let mut headers = http::HeaderMap::new();
    if let Ok(value) = http::HeaderValue::from_str(traceparent) {
        headers.insert("traceparent", value);
        let _ = span.set_parent(carina_proto::trace::extract(&headers));
    }
}

/// A span for one node call of `lv`, continuing its trace.
fn node_span(lv: &LogicVolume, op: Op) -> tracing::Span {
    let span = tracing::info_span!(
        "bridge.node_call",
        otel.name = %format!("bridge {}", op.rpc_for(lv)),
        carina.volume.name = %lv.name_any(),
        k8s.node.name = %lv.spec.node_name,
        carina.group = %lv.spec.device_group,
    );
    if let Some(traceparent) = lv.annotations().get(TRACEPARENT_ANNOTATION) {
        continue_trace(&span, traceparent);
    }
    span
}

/// Writes the failure to the status, publishes a Warning Event, and
/// hands `error` to the error policy.
pub(super) async fn fail(
    lv: &LogicVolume,
    ctx: &Context,
    op: Op,
    error: Error,
) -> Result<Action, Error> {
    let code = error.code().unwrap_or(Code::Unknown);
    let message = error.to_string();
    let status = failed_status(lv, code, &message);
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

/// Carries out what `lv` asks of its node; `local` is its volume's name
/// there ([`LogicVolume::owner`]).
pub(super) async fn apply(lv: &LogicVolume, ctx: &Context, local: &str) -> Result<Action, Error> {
    let (op, wanted) = match plan(lv) {
        Plan::Wait => return Ok(Action::await_change()),
        Plan::Invalid { op, error } => return fail(lv, ctx, op, error).await,
        Plan::Settled => return settled(lv, ctx).await,
        Plan::Call { op, wanted } => (op, wanted),
    };
    let name = lv.name_any();
    if op == Op::Create && local != name {
        // A Go Carina volume taken over exists on its node already.
        let error = Error::Spec {
            field: "status.volumeID",
            reason: format!(
                "unset on a Go Carina volume taken over ({local}); it is never created"
            ),
        };
        return fail(lv, ctx, op, error).await;
    }
    let endpoint = match ctx.endpoint(lv).await {
        Ok(e) => e,
        Err(e) => return fail(lv, ctx, op, e.into()).await,
    };
    let clients = &ctx.clients;
    let result = async {
        match op {
            Op::Create if lv.spec.cache.is_some() => {
                create_bcache(lv, ctx, &endpoint, wanted).await
            }
            Op::Create => {
                let req = pb::CreateLvRequest {
                    name: local.to_string(),
                    device_group: lv.spec.device_group.clone(),
                    size_bytes: wanted,
                    exclusive: lv
                        .annotations()
                        .get(EXCLUSIVE_ANNOTATION)
                        .is_some_and(|v| v == "true"),
                };
                let what = format!("CreateLV {local}");
                let made = clients
                    .call(
                        &endpoint,
                        &what,
                        |mut c| async move { c.create_lv(req).await },
                    )
                    .await?;
                match &lv.spec.source {
                    // Filled before it counts as made: the status (and so
                    // the provisioner) sees the volume once its copy is
                    // complete. A failed copy leaves the volume marked
                    // incomplete on the node; the retry copies again.
                    Some(source) => {
                        copy(clients, &endpoint, &source.volume, local, source.snapshot)
                            .await
                            .map(|v| (Some(v), made.capacity))
                    }
                    None => Ok((made.volume, made.capacity)),
                }
            }
            _ => {
                let req = pb::ResizeLvRequest {
                    name: local.to_string(),
                    size_bytes: wanted,
                };
                let what = format!("ResizeLV {local}");
                clients
                    .call(
                        &endpoint,
                        &what,
                        |mut c| async move { c.resize_lv(req).await },
                    )
                    .await
                    .map(|r| (r.volume, r.capacity))
            }
        }
    }
    .instrument(node_span(lv, op))
    .await;
    let (volume, capacity) = match result {
        Ok((Some(v), capacity)) => (v, capacity),
        Ok((None, _)) => {
            let e = CsiError::Internal(format!(
                "node {}: {} {local} answered without a volume",
                endpoint.node,
                op.rpc_for(lv)
            ));
            return fail(lv, ctx, op, Error::Node(e)).await;
        }
        Err(e) => return fail(lv, ctx, op, Error::Node(e)).await,
    };
    let message = format!(
        "{} bytes in device group {} on node {}",
        volume.size_bytes, volume.device_group, endpoint.node
    );
    let status = made_status(lv, &volume, capacity.as_ref(), &message);
    ctx.write_status(&name, &status).await?;
    let (reason, what) = match op {
        Op::Create => ("Created", "created"),
        _ => ("Resized", "resized"),
    };
    tracing::info!(carina.volume.name = %name, k8s.node.name = %endpoint.node, bytes = volume.size_bytes, "volume {what}");
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

/// `CreateBcache` for the tiered volume `lv`: the node makes the backing
/// volume of `wanted` bytes in `spec.deviceGroup`, the cache volume in
/// `spec.cache.deviceGroup`, and assembles them; the answer as the volume
/// the status records.
async fn create_bcache(
    lv: &LogicVolume,
    ctx: &Context,
    endpoint: &NodeEndpoint,
    wanted: u64,
) -> Result<(Option<pb::LogicVolume>, Option<pb::CapacityVersion>), CsiError> {
    let name = lv.name_any();
    let Some(cache) = lv.spec.cache.as_ref() else {
        return Err(CsiError::Internal(format!("{name} has no cache")));
    };
    // `plan` checked the policy.
    let req = crate::nodes::bcache::create_request(
        &name,
        &lv.spec.device_group,
        wanted,
        &cache.device_group,
        cache.ratio,
        &cache.policy,
    );
    let what = format!("CreateBcache {name}");
    let r = ctx
        .clients
        .call(endpoint, &what, |mut c| async move {
            c.create_bcache(req).await
        })
        .await?;
    Ok((r.device.as_ref().map(|d| bcache_volume(lv, d)), r.capacity))
}

/// Nothing to do on the node: record that this generation is done (after
/// a failed resize whose size was taken back, or a change of other spec
/// fields).
async fn settled(lv: &LogicVolume, ctx: &Context) -> Result<Action, Error> {
    if let Some(status) = settled_status(lv) {
        ctx.write_status(&lv.name_any(), &status).await?;
    }
    Ok(Action::await_change())
}

/// Deletes the volume of `lv`, named `local` on its node.
pub(super) async fn cleanup(lv: &LogicVolume, ctx: &Context, local: &str) -> Result<Action, Error> {
    let name = lv.name_any();
    let endpoint = match ctx.endpoint(lv).await {
        Ok(e) => e,
        Err(EndpointError::NoNode { node }) => {
            let note = format!(
                "node {node:?} has no Node object: nothing left to delete the volume on; releasing the object"
            );
            tracing::warn!(carina.volume.name = %name, k8s.node.name = %node, "{note}");
            ctx.event(lv, EventType::Warning, "NodeGone", Op::Delete, &note)
                .await;
            return Ok(Action::await_change());
        }
        Err(e) => return fail(lv, ctx, Op::Delete, e.into()).await,
    };
    let what = format!("{} {local}", Op::Delete.rpc_for(lv));
    let result = if lv.spec.cache.is_some() {
        // The node deletes the volumes CreateBcache made with the device.
        let req = pb::DeleteBcacheRequest { name: name.clone() };
        ctx.clients
            .call(&endpoint, &what, |mut c| async move {
                c.delete_bcache(req).await
            })
            .instrument(node_span(lv, Op::Delete))
            .await
            .map(drop)
    } else {
        let req = pb::DeleteLvRequest {
            name: local.to_string(),
        };
        ctx.clients
            .call(
                &endpoint,
                &what,
                |mut c| async move { c.delete_lv(req).await },
            )
            .instrument(node_span(lv, Op::Delete))
            .await
            .map(drop)
    };
    match result {
        Ok(_) => {
            tracing::info!(carina.volume.name = %name, k8s.node.name = %endpoint.node, "volume deleted");
            let note = format!("volume deleted on node {}", endpoint.node);
            ctx.event(lv, EventType::Normal, "Deleted", Op::Delete, &note)
                .await;
            Ok(Action::await_change())
        }
        // No such volume, or a name no volume can have: nothing to delete.
        Err(e) if nothing_to_delete(e.code()) => {
            tracing::info!(carina.volume.name = %name, k8s.node.name = %endpoint.node, reason = %e, "no volume to delete");
            Ok(Action::await_change())
        }
        Err(e) => fail(lv, ctx, Op::Delete, Error::Node(e)).await,
    }
}
