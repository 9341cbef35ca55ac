//! Pods' IO limits: Carina's pod annotations
//! ([`carina_api::READ_BPS_ANNOTATION`] and the three others) carried to
//! the pod's node, which holds no Kubernetes credentials, as
//! `SetPodIOLimits` calls: this pod UID, this volume, these limits.
//!
//! - Every Pod with a node is reconciled; a Pod without the annotations
//!   and without limits set before costs no call.
//! - The Pod's Carina volumes are found through its claims (generic
//!   ephemeral ones included): claim → bound PV of this driver → volume id
//!   → the node-local volume name.
//! - Limits are sent again when they change, when an annotation is
//!   removed (as zero: removed), and when the Pod's containers change (on
//!   cgroup v1 each container's cgroup carries the rule, so a restarted
//!   container needs it again).
//! - A Pod whose cgroup is not there yet (`NOT_FOUND`) or whose claim is
//!   not bound yet is retried with backoff.
//! - A malformed value is refused with a Warning Event on the Pod naming
//!   the annotation; nothing is changed until the annotation is.
//! - A deleted or finished Pod gets `ClearPodIOLimits` (its cgroup goes
//!   with it anyway; this keeps nothing behind when it does not): seen
//!   terminating, or found missing from the Pod store by a sweep every
//!   minute (a forced deletion is never seen terminating).
//!
//! What was sent is kept in memory only: after a restart every annotated
//! Pod is sent again, which the node answers idempotently.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use carina_api::quantity::quantity_bytes;
use carina_api::{
    READ_BPS_ANNOTATION, READ_IOPS_ANNOTATION, WRITE_BPS_ANNOTATION, WRITE_IOPS_ANNOTATION,
};
use carina_csi::legacy::VolumeHandle;
use carina_proto::nodestorage as pb;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::DynamicObject;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::watch;
use tonic::Code;
use tracing::Instrument;

use super::endpoints::{Nodes, stopped};
use super::retry::Backoff;
use super::status::truncate;
use crate::nodes::pool::NodeClients;

/// `reportingController` of the Events on Pods.
pub const REPORTER: &str = "carina-iolimits";

/// The annotations, with the limit each sets.
const ANNOTATIONS: [(&str, Field); 4] = [
    (READ_BPS_ANNOTATION, Field::ReadBps),
    (WRITE_BPS_ANNOTATION, Field::WriteBps),
    (READ_IOPS_ANNOTATION, Field::ReadIops),
    (WRITE_IOPS_ANNOTATION, Field::WriteIops),
];

#[derive(Debug, Clone, Copy)]
enum Field {
    ReadBps,
    WriteBps,
    ReadIops,
    WriteIops,
}

/// The limits a Pod's annotations ask for: `None` when it has none of
/// them, an error naming the first malformed one.
pub fn wanted_limits(
    annotations: &std::collections::BTreeMap<String, String>,
) -> Result<Option<pb::IoLimits>, String> {
    let mut limits = pb::IoLimits::default();
    let mut any = false;
    for (key, field) in ANNOTATIONS {
        let Some(value) = annotations.get(key) else {
            continue;
        };
        any = true;
        let n = quantity_bytes(&Quantity(value.clone()))
            .map_err(|e| format!("annotation {key}: {e} (a count such as 10485760 or 10Mi)"))?;
        let slot = match field {
            Field::ReadBps => &mut limits.read_bps,
            Field::WriteBps => &mut limits.write_bps,
            Field::ReadIops | Field::WriteIops if n > u64::from(u32::MAX) => {
                return Err(format!(
                    "annotation {key}: {value:?} is more than {} operations per second",
                    u32::MAX
                ));
            }
            Field::ReadIops => &mut limits.read_iops,
            Field::WriteIops => &mut limits.write_iops,
        };
        *slot = n;
    }
    Ok(any.then_some(limits))
}

/// What was last sent for one Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sent {
    namespace: String,
    name: String,
    node: String,
    limits: pb::IoLimits,
    volumes: BTreeSet<String>,
    /// Container IDs when sent (a new container needs the rule on v1).
    containers: BTreeSet<String>,
}

/// What every reconcile shares.
struct Context {
    client: Client,
    nodes: Nodes,
    clients: Arc<NodeClients>,
    recorder: Recorder,
    retry: Backoff,
    /// By Pod UID.
    sent: Mutex<HashMap<String, Sent>>,
    /// The last refusal told per Pod UID (not repeated until it changes).
    refused: Mutex<HashMap<String, String>>,
    failures: Mutex<HashMap<String, u32>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain maps cannot be left half-changed.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Why a reconcile did not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Retried with backoff: a claim not bound yet, a cgroup not made
    /// yet, a node or the API server not answering.
    #[error("{0}")]
    Later(String),
}

impl Context {
    async fn event(&self, pod: &Pod, type_: EventType, reason: &str, note: &str) {
        let event = KubeEvent {
            type_,
            reason: reason.to_string(),
            note: Some(truncate(note, 1024)),
            action: "SetPodIOLimits".to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &pod.object_ref(&())).await {
            tracing::warn!(k8s.pod.name = %pod.name_any(), error = %e, "publishing an Event failed");
        }
    }

    /// The node-local names of the Pod's Carina volumes. `Err` when a
    /// claim is not bound yet.
    async fn volumes(&self, pod: &Pod) -> Result<BTreeSet<String>, Error> {
        let ns = pod.namespace().unwrap_or_default();
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let mut names = BTreeSet::new();
        let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
        for v in volumes.into_iter().flatten() {
            let claim = match (&v.persistent_volume_claim, &v.ephemeral) {
                (Some(c), _) => c.claim_name.clone(),
                (None, Some(_)) => format!("{}-{}", pod.name_any(), v.name),
                _ => continue,
            };
            let api = |e: kube::Error| Error::Later(format!("claim {ns}/{claim}: {e}"));
            let Some(pvc) = claims.get_opt(&claim).await.map_err(api)? else {
                return Err(Error::Later(format!(
                    "claim {ns}/{claim} does not exist yet"
                )));
            };
            let Some(pv_name) = pvc
                .spec
                .and_then(|s| s.volume_name)
                .filter(|n| !n.is_empty())
            else {
                return Err(Error::Later(format!("claim {ns}/{claim} is not bound yet")));
            };
            let Some(pv) = pvs.get_opt(&pv_name).await.map_err(api)? else {
                return Err(Error::Later(format!("volume {pv_name} does not exist yet")));
            };
            let csi = pv.spec.and_then(|s| s.csi);
            let Some(csi) = csi.filter(|c| c.driver == carina_csi::DRIVER_NAME) else {
                continue;
            };
            // A Go Carina volume taken over keeps its Go id as its name
            // on the node; one not taken over is not on the node's books,
            // and the node says so.
            if let Ok(id) = VolumeHandle::parse(&csi.volume_handle) {
                names.insert(id.local_name());
            }
        }
        Ok(names)
    }

    /// `SetPodIOLimits` of `limits` for every volume; `Ok(refused)` lists
    /// the volumes the node refused for good (HOST volumes).
    async fn send(
        &self,
        node: &str,
        uid: &str,
        volumes: &BTreeSet<String>,
        limits: pb::IoLimits,
    ) -> Result<Vec<String>, Error> {
        let endpoint = self
            .nodes
            .resolve_fresh(node)
            .await
            .map_err(|e| Error::Later(e.to_string()))?;
        let mut refused = Vec::new();
        for volume in volumes {
            let request = pb::SetPodIoLimitsRequest {
                pod_uid: uid.to_string(),
                volume: volume.clone(),
                limits: Some(limits),
            };
            let result = self
                .clients
                .call(&endpoint, "SetPodIOLimits", |mut c| async move {
                    c.set_pod_io_limits(request).await
                })
                .await;
            match result {
                Ok(_) => {}
                Err(e) if matches!(e.code(), Code::FailedPrecondition | Code::InvalidArgument) => {
                    refused.push(format!("{volume}: {e}"));
                }
                Err(e) => return Err(Error::Later(e.to_string())),
            }
        }
        Ok(refused)
    }

    /// Removes what was sent for `uid` (a Pod that is gone or finished).
    async fn clear(&self, uid: &str) {
        let Some(sent) = lock(&self.sent).remove(uid) else {
            return;
        };
        lock(&self.refused).remove(uid);
        lock(&self.failures).remove(uid);
        let Ok(endpoint) = self.nodes.resolve_fresh(&sent.node).await else {
            return;
        };
        let request = pb::ClearPodIoLimitsRequest {
            pod_uid: uid.to_string(),
            volume: String::new(),
        };
        let result = self
            .clients
            .call(&endpoint, "ClearPodIOLimits", |mut c| async move {
                c.clear_pod_io_limits(request).await
            })
            .await;
        match result {
            Ok(r) => tracing::info!(
                k8s.pod.uid = %uid,
                k8s.pod.name = %sent.name,
                k8s.namespace.name = %sent.namespace,
                cleared = r.cleared,
                "IO limits of a finished pod removed"
            ),
            // The kubelet removes the cgroup, and the limits with it.
            Err(e) => tracing::info!(k8s.pod.uid = %uid, error = %e, "removing IO limits"),
        }
    }
}

fn containers(pod: &Pod) -> BTreeSet<String> {
    let status = pod.status.as_ref();
    let all = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .chain(status.and_then(|s| s.init_container_statuses.as_ref()))
        .flatten();
    all.filter_map(|c| c.container_id.clone()).collect()
}

fn finished(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        || matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
}

async fn reconcile(pod: Arc<Pod>, ctx: Arc<Context>) -> Result<Action, Error> {
    let Some(uid) = pod.uid() else {
        return Ok(Action::await_change());
    };
    let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return Ok(Action::await_change());
    };
    if finished(&pod) {
        ctx.clear(&uid).await;
        return Ok(Action::await_change());
    }
    let previous = lock(&ctx.sent).get(&uid).cloned();
    let wanted = match wanted_limits(pod.annotations()) {
        Ok(w) => w,
        Err(reason) => {
            let told = lock(&ctx.refused).insert(uid.clone(), reason.clone());
            if told.as_deref() != Some(reason.as_str()) {
                tracing::info!(k8s.pod.name = %pod.name_any(), %reason, "IO limits refused");
                ctx.event(&pod, EventType::Warning, "InvalidIOLimits", &reason)
                    .await;
            }
            return Ok(Action::await_change());
        }
    };
    lock(&ctx.refused).remove(&uid);
    let limits = match (wanted, &previous) {
        (Some(limits), _) => limits,
        // The annotations were removed: all zero removes the limits.
        (None, Some(_)) => pb::IoLimits::default(),
        // No annotations, nothing sent before: nothing to do.
        (None, None) => return Ok(Action::await_change()),
    };
    let span = tracing::info_span!(
        "iolimits.reconcile",
        k8s.pod.name = %pod.name_any(),
        k8s.namespace.name = %pod.namespace().unwrap_or_default(),
        k8s.pod.uid = %uid,
        k8s.node.name = %node,
    );
    async {
        let volumes = match &previous {
            Some(p) if p.node == node && !p.volumes.is_empty() => p.volumes.clone(),
            _ => ctx.volumes(&pod).await?,
        };
        let next = Sent {
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
            node: node.clone(),
            limits,
            volumes: volumes.clone(),
            containers: containers(&pod),
        };
        if previous.as_ref() == Some(&next) {
            return Ok(Action::await_change());
        }
        let refused = ctx.send(&node, &uid, &volumes, limits).await?;
        for r in &refused {
            ctx.event(&pod, EventType::Warning, "IOLimitsRefused", r)
                .await;
        }
        let removed = wanted.is_none();
        if removed {
            lock(&ctx.sent).remove(&uid);
        } else {
            lock(&ctx.sent).insert(uid.clone(), next.clone());
        }
        lock(&ctx.failures).remove(&uid);
        let changed = previous.as_ref().is_none_or(|p| p.limits != limits);
        if changed && volumes.len() > refused.len() {
            let note = if removed {
                format!("IO limits removed on {}", join(&volumes))
            } else {
                format!("IO limits {} on {}", describe(&limits), join(&volumes))
            };
            tracing::info!(%note, "IO limits sent to the node");
            ctx.event(&pod, EventType::Normal, "IOLimitsSet", &note)
                .await;
        }
        Ok(Action::await_change())
    }
    .instrument(span)
    .await
}

fn join(volumes: &BTreeSet<String>) -> String {
    volumes.iter().cloned().collect::<Vec<_>>().join(", ")
}

fn describe(l: &pb::IoLimits) -> String {
    let parts: Vec<String> = [
        ("read_bps", l.read_bps),
        ("write_bps", l.write_bps),
        ("read_iops", l.read_iops),
        ("write_iops", l.write_iops),
    ]
    .iter()
    .filter(|(_, v)| *v != 0)
    .map(|(k, v)| format!("{k}={v}"))
    .collect();
    if parts.is_empty() {
        "none".to_string()
    } else {
        parts.join(" ")
    }
}

fn error_policy(pod: Arc<Pod>, error: &Error, ctx: Arc<Context>) -> Action {
    let uid = pod.uid().unwrap_or_default();
    let mut failures = lock(&ctx.failures);
    let attempt = failures.entry(uid).or_insert(0);
    let delay = ctx.retry.delay(*attempt);
    *attempt = attempt.saturating_add(1);
    tracing::info!(k8s.pod.name = %pod.name_any(), error = %error, retry_in = ?delay, "IO limits not applied yet");
    Action::requeue(delay)
}

/// Runs the Pod controller until `stop` turns true.
pub(crate) async fn run(
    client: Client,
    nodes: Nodes,
    clients: Arc<NodeClients>,
    retry: Backoff,
    instance: Option<String>,
    mut stop: watch::Receiver<bool>,
) {
    let pods: Api<Pod> = Api::all(client.clone());
    let reporter = Reporter {
        controller: REPORTER.to_string(),
        instance,
    };
    let ctx = Arc::new(Context {
        client: client.clone(),
        nodes,
        clients,
        recorder: Recorder::new(client, reporter),
        retry,
        sent: Mutex::new(HashMap::new()),
        refused: Mutex::new(HashMap::new()),
        failures: Mutex::new(HashMap::new()),
    });
    let gone = ctx.clone();
    let controller = Controller::new(pods, watcher::Config::default());
    let sweep = sweep(ctx.clone(), controller.store(), stop.clone());
    let controller = controller
        .graceful_shutdown_on(async move { stopped(&mut stop).await })
        .run(reconcile, error_policy, ctx)
        .for_each(move |result| {
            let ctx = gone.clone();
            async move {
                match result {
                    Ok(_) | Err(controller::Error::ReconcilerFailed(..)) => {}
                    // Deleted: its limits go with it.
                    Err(controller::Error::ObjectNotFound(r)) => pod_gone(&ctx, &r).await,
                    Err(e) => tracing::warn!(error = %e, "Pod controller for IO limits"),
                }
            }
        });
    tokio::join!(controller, sweep);
}

/// How often Pods deleted without being seen terminating (a forced
/// deletion, a watch that missed it) are looked for.
const SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// Clears what was sent for Pods that are no longer in the store: the
/// controller reconciles objects that exist, so a Pod deleted at once
/// (`--grace-period=0 --force`) is only found missing.
async fn sweep(ctx: Arc<Context>, store: Store<Pod>, mut stop: watch::Receiver<bool>) {
    tokio::select! {
        ready = store.wait_until_ready() => if ready.is_err() { return },
        _ = stopped(&mut stop) => return,
    }
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped(&mut stop) => return,
        }
        let missing: Vec<String> = lock(&ctx.sent)
            .iter()
            .filter(|(uid, s)| {
                let at = ObjectRef::<Pod>::new(&s.name).within(&s.namespace);
                store.get(&at).and_then(|p| p.uid()).as_deref() != Some(uid.as_str())
            })
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in missing {
            ctx.clear(&uid).await;
        }
    }
}

async fn pod_gone(ctx: &Context, r: &ObjectRef<DynamicObject>) {
    let uid = lock(&ctx.sent).iter().find_map(|(uid, s)| {
        (s.name == r.name && Some(&s.namespace) == r.namespace.as_ref()).then(|| uid.clone())
    });
    if let Some(uid) = uid {
        ctx.clear(&uid).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn carina_annotations_become_limits() {
        assert_eq!(wanted_limits(&annotations(&[("other", "1")])), Ok(None));
        let l = wanted_limits(&annotations(&[
            (READ_BPS_ANNOTATION, "10485760"),
            (WRITE_BPS_ANNOTATION, "10Mi"),
            (READ_IOPS_ANNOTATION, "10000"),
            (WRITE_IOPS_ANNOTATION, "1k"),
        ]))
        .expect("valid")
        .expect("annotated");
        assert_eq!(
            (l.read_bps, l.write_bps, l.read_iops, l.write_iops),
            (10485760, 10485760, 10000, 1000)
        );
        // One annotation alone; "0" is no limit but still an annotation.
        let l = wanted_limits(&annotations(&[(WRITE_IOPS_ANNOTATION, "0")])).expect("valid");
        assert_eq!(l, Some(pb::IoLimits::default()));
    }

    #[test]
    fn malformed_values_name_the_annotation() {
        for (key, value) in [
            (READ_BPS_ANNOTATION, "fast"),
            (WRITE_BPS_ANNOTATION, "-1"),
            (READ_IOPS_ANNOTATION, "10x"),
            (WRITE_IOPS_ANNOTATION, "5000000000"),
            (WRITE_BPS_ANNOTATION, ""),
        ] {
            let err = wanted_limits(&annotations(&[(key, value)])).expect_err("refused");
            assert!(err.contains(key), "{key}={value:?}: {err}");
        }
    }

    #[test]
    fn limits_read_as_people_write_them() {
        assert_eq!(describe(&pb::IoLimits::default()), "none");
        let l = pb::IoLimits {
            write_bps: 5,
            read_iops: 7,
            ..Default::default()
        };
        assert_eq!(describe(&l), "write_bps=5 read_iops=7");
    }
}
