//! Pod migration off a dead node, Carina's opt-in: a Pod annotated
//! [`POD_MIGRATION`](carina_csi::params::POD_MIGRATION)` = "true"` whose
//! node has been NotReady (its `Ready` condition not `True`) for longer
//! than the grace period loses its Carina claims and is deleted, so its
//! controller (a StatefulSet) makes both again and the scheduler puts them
//! on a live node. The data on the dead node is given up, and the Events
//! say so: a Warning on the Pod and on each claim, naming the node, the
//! outage's start and the volume.
//!
//! - Never for a Pod without the annotation (or with any other value),
//!   never while the node is Ready, never before the grace period has
//!   passed since the `Ready` condition last changed.
//! - The Pod's word is not enough to give up a claim: each Carina claim's
//!   StorageClass must allow it too ([`class_allows_migration`]: the same
//!   key as a StorageClass annotation, as Carina has it, or parameter,
//!   `"true"`), and no other Pod that is not finished (phase neither
//!   `Succeeded` nor `Failed`) may use the claim. Otherwise nothing of that
//!   Pod is touched (neither a claim nor the Pod): a Warning Event
//!   (`PodMigrationRefused`) on the Pod says why, once per reason, and the
//!   Pod is looked at again every 10 s while the outage lasts.
//! - Once per Pod per outage: the Pods acted on are remembered by UID for
//!   the outage (the `Ready` condition's `lastTransitionTime`); a node
//!   that comes back forgets them. A leader that takes over acts on what
//!   is left (deleting what is already gone is done).
//! - Claims first, then the Pod with no grace period (its kubelet is gone
//!   and would never confirm a graceful deletion): a claim is removed
//!   once no Pod uses it, so the StatefulSet makes a new one for the new
//!   Pod instead of reusing the old.
//! - A claim is Carina's when its volume is a PV of this driver, or, while
//!   unbound, its StorageClass names this driver. A Pod with none is
//!   still deleted (it asked to move).
//! - The claims of a Pod that a controller other than a StatefulSet owns
//!   (a Deployment's) are made again once the old ones are gone, as Go
//!   Carina did, so its new Pod does not wait for a claim nobody makes
//!   ([`recreate`]).
//!
//! The sweep runs when a Node changes, when the next outage reaches its
//! grace period, and 10 s after a sweep that an API error cut short or
//! that refused a Pod.
//!
//! Where things are: [`outage`] tells when a node's outage is due;
//! [`consent`] decides whether a Pod's claims may be given up (the Pod's
//! opt-in, the StorageClass, other Pods using a claim, which claims are
//! Carina's); [`recreate`] makes a moved Deployment's claims again; this
//! module runs the sweep and deletes claims and Pods.

mod consent;
mod outage;
mod recreate;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::watch;

use super::endpoints::{Nodes, stopped};
use super::status::truncate;
use consent::claim_names;
use outage::{earlier, not_ready_since};

pub use consent::{allows_migration, class_allows_migration};
pub use outage::outage_start;
use recreate::Pending;
pub use recreate::{RECREATED_FROM, recreates_claims, successor};

/// `reportingController` of the Events.
pub const REPORTER: &str = "carina-pod-migration";

/// How soon a sweep that failed (an API error) is tried again.
const RETRY: Duration = Duration::from_secs(10);

/// How soon claims waiting to be made again are looked at (the old claim
/// goes as soon as its Pod is gone).
const RECREATE_RETRY: Duration = Duration::from_secs(2);

/// The Pods acted on in one node's current outage.
#[derive(Debug, Default)]
struct Outage {
    since: Option<Timestamp>,
    pods: BTreeSet<String>,
    /// Pods refused, by UID, with the reason last told in an Event.
    refused: BTreeMap<String, String>,
}

/// What became of one Pod.
#[derive(Debug)]
enum Outcome {
    /// Its claims and the Pod are deleted; these claims are to be made
    /// again.
    Moved(Vec<Pending>),
    /// Nothing was touched, for this reason.
    Refused(String),
}

struct Migrator {
    client: Client,
    nodes: Nodes,
    grace: Duration,
    recorder: Recorder,
    /// By node name.
    outages: BTreeMap<String, Outage>,
    /// Claims to make again, by `namespace/name`.
    recreate: BTreeMap<String, Pending>,
}

impl Migrator {
    /// Acts on every node past its grace period; returns when the next
    /// outage known now reaches its own.
    async fn sweep(&mut self) -> Option<Timestamp> {
        let now = Timestamp::now();
        let mut next: Option<Timestamp> = None;
        self.recreate_claims().await;
        let nodes = self.nodes.all();
        // A node that is Ready again, or gone, forgets its outage.
        self.outages.retain(|name, _| {
            nodes
                .iter()
                .any(|n| n.name_any() == *name && not_ready_since(n).is_some())
        });
        for node in nodes {
            let Some(since) = not_ready_since(&node) else {
                continue;
            };
            let name = node.name_any();
            match outage_start(&node, now, self.grace) {
                Some(since) => {
                    if !self.migrate_from(&name, since).await {
                        next = earlier(next, now.checked_add(RETRY).ok());
                    }
                }
                None => next = earlier(next, since.checked_add(self.grace).ok()),
            }
        }
        if !self.recreate_claims().await {
            next = earlier(next, now.checked_add(RECREATE_RETRY).ok());
        }
        next
    }

    /// Moves every opted-in Pod off `node`, whose outage began at `since`;
    /// false when something failed or a Pod was refused: both are looked
    /// at again.
    async fn migrate_from(&mut self, node: &str, since: Timestamp) -> bool {
        let outage = self.outages.entry(node.to_string()).or_default();
        if outage.since != Some(since) {
            *outage = Outage {
                since: Some(since),
                ..Outage::default()
            };
        }
        let pods: Api<Pod> = Api::all(self.client.clone());
        let listed = match pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
        {
            Ok(l) => l.items,
            Err(e) => {
                tracing::warn!(k8s.node.name = %node, error = %e, "listing the pods of a NotReady node failed; trying again");
                return false;
            }
        };
        let mut all_done = true;
        for pod in listed.iter().filter(|p| allows_migration(p)) {
            let Some(uid) = pod.uid() else { continue };
            let done = self
                .outages
                .get(node)
                .is_some_and(|o| o.pods.contains(&uid));
            if done {
                continue;
            }
            let told = self
                .outages
                .get(node)
                .and_then(|o| o.refused.get(&uid).cloned());
            match self.migrate(pod, node, since, told.as_deref()).await {
                Ok(Outcome::Moved(claims)) => {
                    if let Some(o) = self.outages.get_mut(node) {
                        o.refused.remove(&uid);
                        o.pods.insert(uid);
                    }
                    for pending in claims {
                        self.recreate.insert(pending.key(), pending);
                    }
                }
                // Looked at again soon: the other Pod may finish.
                Ok(Outcome::Refused(reason)) => {
                    all_done = false;
                    if let Some(o) = self.outages.get_mut(node) {
                        o.refused.insert(uid, reason);
                    }
                }
                Err(e) => {
                    all_done = false;
                    tracing::warn!(k8s.pod.name = %pod.name_any(), k8s.node.name = %node, error = %e, "moving a pod off a NotReady node failed; trying again");
                }
            }
        }
        all_done
    }

    /// Deletes the Pod's Carina claims, then the Pod, unless a claim may
    /// not be given up ([`Self::refusal`]); then nothing is deleted and,
    /// unless `told` is that reason already, an Event says why.
    #[tracing::instrument(name = "migration.pod", skip_all, err, fields(k8s.pod.name = %pod.name_any(), k8s.namespace.name = %pod.namespace().unwrap_or_default(), k8s.node.name = %node))]
    async fn migrate(
        &self,
        pod: &Pod,
        node: &str,
        since: Timestamp,
        told: Option<&str>,
    ) -> Result<Outcome, kube::Error> {
        let ns = pod.namespace().unwrap_or_default();
        let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        let mut claims = Vec::new();
        for name in claim_names(pod) {
            if let Some(claim) = claims_api.get_opt(&name).await?
                && self.is_carina(&claim).await?
            {
                claims.push(claim);
            }
        }
        let outage = format!(
            "node {node} has not been Ready since {since} (longer than {:?})",
            self.grace
        );
        if let Some(reason) = self.refusal(pod, &claims).await? {
            if told != Some(reason.as_str()) {
                let note = format!(
                    "{outage}; the pod allows migration but {reason}: neither the pod nor any of its claims is deleted"
                );
                tracing::warn!(%note, "pod migration refused");
                self.event(pod, "PodMigrationRefused", &note).await;
            }
            return Ok(Outcome::Refused(reason));
        }
        let volumes: Vec<String> = claims
            .iter()
            .map(|c| {
                let volume = c.spec.as_ref().and_then(|s| s.volume_name.clone());
                format!(
                    "{ns}/{} (volume {})",
                    c.name_any(),
                    volume.as_deref().unwrap_or("not bound")
                )
            })
            .collect();
        let again = recreates_claims(pod);
        let note = if volumes.is_empty() {
            format!("{outage}; the pod allows migration and has no Carina claims: deleting it")
        } else if again {
            format!(
                "{outage}; the pod allows migration: deleting claims {} and the pod, then making the claims again (empty) so its controller starts it on another node; the data of these volumes on {node} is given up",
                volumes.join(", ")
            )
        } else {
            format!(
                "{outage}; the pod allows migration: deleting claims {} and the pod so they are made again on another node; the data of these volumes on {node} is given up",
                volumes.join(", ")
            )
        };
        tracing::warn!(%note, "moving a pod off a NotReady node");
        self.event(pod, "PodMigration", &note).await;
        let why = format!("pod {ns}/{} moved off node {node}", pod.name_any());
        let mut pending = Vec::new();
        for claim in &claims {
            let volume = claim
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.clone())
                .unwrap_or_else(|| "not bound".to_string());
            let note = format!(
                "{outage}; pod {ns}/{} allows migration: this claim is deleted and the data of its volume {volume} on {node} is given up",
                pod.name_any()
            );
            self.event(claim, "VolumeDataGivenUp", &note).await;
            match claims_api
                .delete(&claim.name_any(), &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
            if again {
                pending.push(Pending::new(claim, why.clone()));
            }
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let mut delete = DeleteParams::default().grace_period(0);
        // The Pod we decided on, not a new one of the same name.
        delete.preconditions = pod.uid().map(|uid| kube::api::Preconditions {
            uid: Some(uid),
            resource_version: None,
        });
        match pods.delete(&pod.name_any(), &delete).await {
            Ok(_) => Ok(Outcome::Moved(pending)),
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {
                Ok(Outcome::Moved(pending))
            }
            Err(e) => Err(e),
        }
    }

    async fn event<K>(&self, object: &K, reason: &str, note: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        let event = KubeEvent {
            type_: EventType::Warning,
            reason: reason.to_string(),
            note: Some(truncate(note, 1024)),
            action: "MigratePod".to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &object.object_ref(&())).await {
            tracing::warn!(error = %e, "publishing an Event failed");
        }
    }
}

/// Runs the migration until `stop` turns true. `grace` of `None` turns it
/// off.
pub(crate) async fn run(
    client: Client,
    nodes: Nodes,
    grace: Option<Duration>,
    instance: Option<String>,
    mut stop: watch::Receiver<bool>,
) {
    let Some(grace) = grace else {
        tracing::info!("pod migration off NotReady nodes is off");
        return;
    };
    let reporter = Reporter {
        controller: REPORTER.to_string(),
        instance,
    };
    let mut migrator = Migrator {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        nodes: nodes.clone(),
        grace,
        outages: BTreeMap::new(),
        recreate: BTreeMap::new(),
    };
    let mut changes = nodes.changes();
    nodes.ready().await;
    tracing::info!(grace = ?grace, "pod migration off NotReady nodes running");
    loop {
        let next = migrator.sweep().await;
        let wait = next.map(|due| {
            let left = due.duration_since(Timestamp::now());
            // A due time already past is a sweep right away.
            Duration::try_from(left).unwrap_or(Duration::ZERO) + Duration::from_millis(50)
        });
        tokio::select! {
            _ = stopped(&mut stop) => return,
            changed = changes.changed() => if changed.is_err() { return },
            _ = sleep(wait) => {}
        }
    }
}

/// Sleeps `wait`, or forever when `None`.
async fn sleep(wait: Option<Duration>) {
    match wait {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}
