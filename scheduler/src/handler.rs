//! The extender's two verbs over the cluster objects: `/filter` and
//! `/prioritize`, from request body to response body. No HTTP here (see
//! [`crate::server`]) and no API call: everything is read from
//! [`Objects`].
//!
//! - A pod without claims passes every node untouched: the request's
//!   `NodeNames` text is echoed back without being parsed, and
//!   `/prioritize` answers `[]` (no preference).
//! - A pod whose claims are not Carina's gets the same answer once its
//!   claims have been looked up.
//! - A pod with Carina claims: [`crate::request::collect`], then (for new
//!   volumes) [`Settle::wait_for_others`], then the reservations and
//!   [`crate::filter::decide`]. Failing nodes go to
//!   `FailedAndUnresolvableNodes`: evicting pods frees no local storage,
//!   so preemption would not help.
//! - An object missing from the cache (a claim just created) is waited
//!   for briefly ([`UNKNOWN_WAIT`]); still missing, or caches not synced
//!   yet: `Error`, and kube-scheduler retries the pod after a backoff.

use std::collections::BTreeMap;
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use carina_api::{NodeStorageResource, NodeStorageResourceStatus};
use carina_csi::strategy::Strategy;

use crate::extender::{ExtenderArgs, ExtenderFilterResult, NodeNames};
use crate::filter::{Decision, decide};
use crate::metrics::ExtenderMetrics;
use crate::objects::Objects;
use crate::request::{Collected, PodRequest, collect};
use crate::reservations::Reservations;
use crate::score::{self, Basis};
use crate::settle::Settle;

/// How long `/filter` waits for an object missing from the cache before
/// answering `Error`.
pub const UNKNOWN_WAIT: Duration = Duration::from_millis(500);

/// A request body that is not what kube-scheduler sends.
#[derive(Debug, thiserror::Error)]
pub enum BadRequest {
    #[error("malformed extender arguments: {0}")]
    Malformed(#[source] serde_json::Error),
    #[error("malformed NodeNames: {0}")]
    NodeNames(#[source] serde_json::Error),
}

/// The extender: a strategy, the objects it reads, and what it keeps
/// between calls (the reservations of the current state, the pods whose
/// node is not visible yet).
#[derive(Debug)]
pub struct Extender<O: ?Sized> {
    strategy: Strategy,
    settle: Settle,
    reservations: Mutex<Option<(u64, Arc<Reservations>)>>,
    /// The nodes the last `/filter` passed: kube-scheduler asks
    /// `/prioritize` for the same pod and nodes right after.
    last: Mutex<Option<Passed>>,
    objects: Arc<O>,
    metrics: ExtenderMetrics,
}

/// The nodes a `/filter` passed, for the `/prioritize` that follows.
#[derive(Debug)]
struct Passed {
    uid: String,
    /// The objects' change counter the decision was made at.
    generation: u64,
    nodes: Arc<Vec<(String, Basis)>>,
}

/// A node's published status, kept alive by its object.
struct Status(Arc<NodeStorageResource>);

impl Deref for Status {
    type Target = NodeStorageResourceStatus;
    fn deref(&self) -> &NodeStorageResourceStatus {
        // Only made for objects with a status (see `status_of`).
        self.0.status.as_ref().unwrap_or(&EMPTY)
    }
}

static EMPTY: NodeStorageResourceStatus = NodeStorageResourceStatus {
    sync_time: None,
    capacity: BTreeMap::new(),
    allocatable: BTreeMap::new(),
    groups: Vec::new(),
    node_generation: None,
    node_incarnation: None,
    vg_groups: Vec::new(),
    disks: Vec::new(),
    conditions: Vec::new(),
    observed_generation: None,
};

impl<O: Objects + ?Sized> Extender<O> {
    /// `settle_timeout` bounds the wait for another pod's chosen node
    /// ([`Settle`]).
    pub fn new(objects: Arc<O>, strategy: Strategy, settle_timeout: Duration) -> Self {
        Extender {
            strategy,
            settle: Settle::new(settle_timeout),
            reservations: Mutex::new(None),
            last: Mutex::new(None),
            objects,
            metrics: ExtenderMetrics::default(),
        }
    }

    /// What `/metrics` serves.
    pub fn metrics(&self) -> &ExtenderMetrics {
        &self.metrics
    }

    pub fn objects(&self) -> &O {
        &self.objects
    }

    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// Whether the answers are complete (every cache listed once).
    pub fn ready(&self) -> bool {
        self.objects.synced()
    }

    /// Answers `/filter`: the body of an `ExtenderFilterResult`.
    ///
    /// # Errors
    /// A body that does not parse as `ExtenderArgs`.
    pub async fn filter(&self, body: &[u8]) -> Result<Vec<u8>, BadRequest> {
        let args: ExtenderArgs<'_> = serde_json::from_slice(body).map_err(BadRequest::Malformed)?;
        let Some(pod) = &args.pod else {
            return Ok(to_json(&ExtenderFilterResult {
                error: "the request carries no Pod".into(),
                ..ExtenderFilterResult::default()
            }));
        };
        let everyone = || ExtenderFilterResult {
            node_names: args.node_names.map(NodeNames::Echo),
            nodes: args.nodes.clone(),
            ..ExtenderFilterResult::default()
        };
        if pod.claim_names().next().is_none() {
            return Ok(to_json(&everyone()));
        }
        if !self.objects.synced() {
            return Ok(to_json(&ExtenderFilterResult {
                error: "the extender's caches have not synced yet".into(),
                ..ExtenderFilterResult::default()
            }));
        }
        let req = match self.collect_waiting(pod).await {
            Collected::NotCarina => return Ok(to_json(&everyone())),
            Collected::Unknown(why) => {
                tracing::debug!(pod = %pod.key(), why, "filter: retry later");
                return Ok(to_json(&ExtenderFilterResult {
                    error: why,
                    ..ExtenderFilterResult::default()
                }));
            }
            Collected::Unschedulable(reason) => {
                tracing::info!(pod = %pod.key(), reason, "filter: no node can take the pod");
                let failed = args
                    .candidates()
                    .map_err(BadRequest::NodeNames)?
                    .into_iter()
                    .map(|n| (n.into_owned(), reason.clone()))
                    .collect();
                return Ok(to_json(&ExtenderFilterResult {
                    node_names: args.node_names.map(|_| NodeNames::List(Vec::new())),
                    nodes: args.nodes.as_ref().map(|l| l.retain_names(|_| false)),
                    failed_and_unresolvable_nodes: failed,
                    ..ExtenderFilterResult::default()
                }));
            }
            Collected::Request(req) => req,
        };
        if !req.volumes.is_empty() {
            self.settle
                .wait_for_others(&pod.metadata.uid, &*self.objects)
                .await;
        }
        let (generation, decision) = self.decide(&args, &req).map_err(BadRequest::NodeNames)?;
        if !decision.passed.is_empty() {
            self.settle
                .record(pod, req.awaiting_node.clone(), &*self.objects);
        }
        tracing::debug!(
            pod = %pod.key(),
            passed = decision.passed.len(),
            failed = decision.failed.len(),
            "filter"
        );
        let Decision { passed, failed } = decision;
        let passed = Arc::new(passed);
        *lock(&self.last) = Some(Passed {
            uid: pod.metadata.uid.clone(),
            generation,
            nodes: passed.clone(),
        });
        let names: Vec<&str> = passed.iter().map(|(n, _)| n.as_str()).collect();
        let nodes = args.nodes.as_ref().map(|l| {
            let keep: std::collections::HashSet<&str> = names.iter().copied().collect();
            l.retain_names(|n| keep.contains(n))
        });
        Ok(to_json(&ExtenderFilterResult {
            nodes,
            node_names: args.node_names.map(|_| NodeNames::Borrowed(names)),
            failed_and_unresolvable_nodes: failed,
            ..ExtenderFilterResult::default()
        }))
    }

    /// Answers `/prioritize`: the body of a `HostPriorityList`.
    ///
    /// # Errors
    /// A body that does not parse as `ExtenderArgs`.
    pub async fn prioritize(&self, body: &[u8]) -> Result<Vec<u8>, BadRequest> {
        let args: ExtenderArgs<'_> = serde_json::from_slice(body).map_err(BadRequest::Malformed)?;
        let none = || Ok(b"[]".to_vec());
        let Some(pod) = &args.pod else { return none() };
        if pod.claim_names().next().is_none() || !self.objects.synced() {
            return none();
        }
        let Collected::Request(req) = collect(pod, &*self.objects) else {
            return none();
        };
        let passed = match self.recall(&pod.metadata.uid, &args) {
            Some(nodes) => nodes,
            None => Arc::new(
                self.decide(&args, &req)
                    .map_err(BadRequest::NodeNames)?
                    .1
                    .passed,
            ),
        };
        let list = score::prioritize(self.strategy, passed.iter().map(|(n, b)| (n.as_str(), *b)));
        tracing::debug!(pod = %pod.key(), scores = ?list, "prioritize");
        Ok(to_json(&list))
    }

    /// [`collect`], waiting up to [`UNKNOWN_WAIT`] for objects the cache
    /// lacks: a pod is often scheduled within milliseconds of its claim's
    /// creation, and an `Error` would cost it a backoff of a second or
    /// more.
    async fn collect_waiting(&self, pod: &crate::extender::Pod) -> Collected {
        let deadline = tokio::time::Instant::now() + UNKNOWN_WAIT;
        let mut changes = self.objects.changes();
        loop {
            changes.borrow_and_update();
            let collected = collect(pod, &*self.objects);
            if !matches!(collected, Collected::Unknown(_)) {
                return collected;
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return collected },
                () = tokio::time::sleep_until(deadline) => return collected,
            }
        }
    }

    /// The last `/filter`'s passing nodes, if they were decided for this
    /// pod on the objects as they are now and are exactly the candidates
    /// asked about (kube-scheduler keeps the order).
    fn recall(&self, uid: &str, args: &ExtenderArgs<'_>) -> Option<Arc<Vec<(String, Basis)>>> {
        let nodes = {
            let last = lock(&self.last);
            let last = last.as_ref()?;
            if last.uid != uid || last.generation != self.generation() {
                return None;
            }
            last.nodes.clone()
        };
        let candidates = args.candidates().ok()?;
        let same = candidates.len() == nodes.len()
            && candidates
                .iter()
                .zip(nodes.iter())
                .all(|(c, (n, _))| c.as_ref() == n.as_str());
        same.then_some(nodes)
    }

    fn generation(&self) -> u64 {
        *self.objects.changes().borrow()
    }

    /// The verdicts for the request's candidates, and the objects' change
    /// counter they were decided at.
    fn decide(
        &self,
        args: &ExtenderArgs<'_>,
        req: &PodRequest,
    ) -> Result<(u64, Decision), serde_json::Error> {
        let generation = self.generation();
        let candidates = args.candidates()?;
        let reservations = if req.volumes.is_empty() {
            Arc::new(Reservations::default())
        } else {
            self.reservations()
        };
        let objects = &*self.objects;
        Ok((
            generation,
            decide(
                req,
                candidates.iter().map(|c| c.as_ref()),
                |node| {
                    objects
                        .node_storage(node)
                        .filter(|n| n.status.is_some())
                        .map(Status)
                },
                |node| reservations.on(node),
            ),
        ))
    }

    /// The reservations of the objects as they are now; computed again
    /// only after a change.
    fn reservations(&self) -> Arc<Reservations> {
        let generation = self.generation();
        let mut cached = lock(&self.reservations);
        if let Some((g, r)) = cached.as_ref()
            && *g == generation
        {
            return r.clone();
        }
        let fresh = Arc::new(Reservations::build(&*self.objects));
        self.metrics.set_in_flight(fresh.len());
        *cached = Some((generation, fresh.clone()));
        fresh
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // What the mutexes hold is replaced whole, never left half-written.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn to_json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    // The result types are maps with string keys, strings, numbers and
    // raw JSON that was parsed already: serializing cannot fail.
    serde_json::to_vec(value).unwrap_or_else(|e| {
        format!(r#"{{"Error":"cannot serialize the answer: {e}"}}"#).into_bytes()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;
    use serde_json::{Value, json};

    const GIB: u64 = 1 << 30;

    fn extender(strategy: Strategy) -> Extender<crate::objects::MemoryObjects> {
        let objects = ssd_and_other_classes();
        for (node, gib) in [("a", 100), ("b", 200), ("c", 300)] {
            objects.insert_node_storage(nsr(node, vec![lvm_group("ssd", gib * GIB)]));
        }
        Extender::new(Arc::new(objects), strategy, Duration::from_millis(50))
    }

    const ARGS: &str = r#"{"Pod": {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"volumes": [{"name": "c", "persistentVolumeClaim": {"claimName": "c"}}]}},
        "NodeNames": ["a", "b", "c"]}"#;

    proptest::proptest! {
        /// Any body sent to /filter or /prioritize gets an answer or a
        /// bad-request refusal, never a panic; an answer is JSON.
        #[test]
        fn extender_requests_take_anything(
            body in proptest::prelude::prop_oneof![
                carina_sys::testkit::noisy_text(),
                carina_sys::testkit::mutated_text(ARGS),
            ],
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("a runtime");
            let e = extender(Strategy::Spreadout);
            runtime.block_on(async {
                let answers = [e.filter(body.as_bytes()).await, e.prioritize(body.as_bytes()).await];
                for bytes in answers.into_iter().flatten() {
                    serde_json::from_slice::<Value>(&bytes).expect("the answer is JSON");
                }
            });
        }
    }

    fn args(pod_claims: &[&str], nodes: &[&str]) -> Vec<u8> {
        let volumes: Vec<Value> = pod_claims
            .iter()
            .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
            .collect();
        json!({
            "Pod": {"metadata": {"name": "p", "namespace": "ns", "uid": "u-p"},
                    "spec": {"volumes": volumes}},
            "NodeNames": nodes,
        })
        .to_string()
        .into_bytes()
    }

    async fn filter(e: &Extender<crate::objects::MemoryObjects>, body: &[u8]) -> Value {
        serde_json::from_slice(&e.filter(body).await.expect("answers")).expect("json")
    }

    async fn prioritize(e: &Extender<crate::objects::MemoryObjects>, body: &[u8]) -> Value {
        serde_json::from_slice(&e.prioritize(body).await.expect("answers")).expect("json")
    }

    #[tokio::test]
    async fn pods_without_carina_claims_pass_untouched() {
        let e = extender(Strategy::Binpack);
        e.objects()
            .insert_claim(claim("ns", "o", Some("other"), "1Gi"));
        for claims in [&[][..], &["o"][..]] {
            let body = args(claims, &["a", "b", "zzz"]);
            let f = filter(&e, &body).await;
            assert_eq!(f["NodeNames"], json!(["a", "b", "zzz"]));
            assert_eq!(f["FailedAndUnresolvableNodes"], json!({}));
            assert_eq!(f["Error"], "");
            assert_eq!(prioritize(&e, &body).await, json!([]));
        }
    }

    #[tokio::test]
    async fn strategies_pick_different_nodes_and_too_large_fails_everywhere() {
        for (strategy, best) in [(Strategy::Binpack, "a"), (Strategy::Spreadout, "c")] {
            let e = extender(strategy);
            e.objects()
                .insert_claim(claim("ns", "d", Some("ssd"), "10Gi"));
            let body = args(&["d"], &["a", "b", "c"]);
            let f = filter(&e, &body).await;
            assert_eq!(f["NodeNames"], json!(["a", "b", "c"]));
            let scores = prioritize(&e, &body).await;
            let top = scores
                .as_array()
                .expect("list")
                .iter()
                .max_by_key(|h| h["Score"].as_i64())
                .expect("scores");
            assert_eq!(top["Host"], best, "{strategy}: {scores}");
            assert_eq!(top["Score"], 10);
        }
        let e = extender(Strategy::Binpack);
        e.objects()
            .insert_claim(claim("ns", "huge", Some("ssd"), "400Gi"));
        let f = filter(&e, &args(&["huge"], &["a", "b", "c"])).await;
        assert_eq!(f["NodeNames"], json!([]));
        let failed = f["FailedAndUnresolvableNodes"].as_object().expect("map");
        assert_eq!(failed.len(), 3);
        assert!(
            failed["a"].as_str().is_some_and(
                |r| r.contains("has 100.0 GiB allocatable, claim ns/huge needs 400.0 GiB")
            ),
            "{f}"
        );
    }

    #[tokio::test]
    async fn in_flight_claims_of_others_count_but_own_do_not() {
        let e = extender(Strategy::Binpack);
        let o = e.objects();
        // Another pod's claim already placed on a: 95 GiB of its 100.
        o.insert_claim(selected(claim("ns", "x", Some("ssd"), "95Gi"), "a"));
        o.insert_claim(claim("ns", "d", Some("ssd"), "10Gi"));
        let f = filter(&e, &args(&["d"], &["a", "b"])).await;
        assert_eq!(f["NodeNames"], json!(["b"]));
        assert!(
            f["FailedAndUnresolvableNodes"]["a"]
                .as_str()
                .is_some_and(|r| r.contains("after 95.0 GiB in flight"))
        );
        // The pod's own annotated claim is not held against it.
        o.insert_claim(selected(claim("ns", "d", Some("ssd"), "10Gi"), "a"));
        let f = filter(&e, &args(&["d", "x"], &["a"])).await;
        assert_eq!(f["NodeNames"], json!([]), "d and x together do not fit a");
        let f = filter(&e, &args(&["d"], &["b"])).await;
        assert_eq!(f["NodeNames"], json!(["b"]));
    }

    #[tokio::test]
    async fn unknown_claims_ask_for_a_retry_and_conflicts_refuse_all() {
        let e = extender(Strategy::Binpack);
        let f = filter(&e, &args(&["missing"], &["a"])).await;
        assert!(
            f["Error"]
                .as_str()
                .is_some_and(|s| s.contains("ns/missing")),
            "{f}"
        );
        let o = e.objects();
        o.insert_claim(bound_claim("ns", "p1", "pv1"));
        o.insert_claim(bound_claim("ns", "p2", "pv2"));
        o.insert_volume(carina_pv("pv1", Some("a"), None));
        o.insert_volume(carina_pv("pv2", Some("b"), None));
        let f = filter(&e, &args(&["p1", "p2"], &["a", "b"])).await;
        assert_eq!(f["NodeNames"], json!([]));
        assert!(
            f["FailedAndUnresolvableNodes"]["b"]
                .as_str()
                .is_some_and(|r| r.contains("different nodes (a and b)"))
        );
        // One pin: only its node passes, with the top score.
        let body = args(&["p1"], &["a", "b"]);
        let f = filter(&e, &body).await;
        assert_eq!(f["NodeNames"], json!(["a"]));
        assert_eq!(
            prioritize(&e, &args(&["p1"], &["a"])).await,
            json!([{"Host": "a", "Score": 10}])
        );
    }

    #[tokio::test]
    async fn prioritize_reuses_the_filter_decision_only_while_nothing_changed() {
        let e = extender(Strategy::Binpack);
        e.objects()
            .insert_claim(claim("ns", "d", Some("ssd"), "10Gi"));
        let body = args(&["d"], &["a", "b", "c"]);
        filter(&e, &body).await;
        let hosts = |v: Value| -> Vec<String> {
            v.as_array()
                .expect("list")
                .iter()
                .map(|h| h["Host"].as_str().expect("host").to_string())
                .collect()
        };
        assert_eq!(hosts(prioritize(&e, &body).await), ["a", "b", "c"]);
        // Another pod's claim fills a: the cached decision is stale.
        e.objects()
            .insert_claim(selected(claim("ns", "x", Some("ssd"), "95Gi"), "a"));
        assert_eq!(hosts(prioritize(&e, &body).await), ["b", "c"]);
        // Other candidates than the filter's: decided afresh.
        filter(&e, &body).await;
        assert_eq!(hosts(prioritize(&e, &args(&["d"], &["c"])).await), ["c"]);
    }

    #[tokio::test]
    async fn node_objects_are_filtered_when_names_are_not_sent() {
        let e = extender(Strategy::Binpack);
        e.objects()
            .insert_claim(claim("ns", "d", Some("ssd"), "150Gi"));
        let body = json!({
            "Pod": {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
                    "spec": {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "d"}}]}},
            "Nodes": {"items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]},
        })
        .to_string();
        let f = filter(&e, body.as_bytes()).await;
        assert_eq!(f["Nodes"]["items"], json!([{"metadata": {"name": "b"}}]));
        assert_eq!(f["NodeNames"], Value::Null);
    }

    #[tokio::test]
    async fn malformed_bodies_are_refused() {
        let e = extender(Strategy::Binpack);
        assert!(e.filter(b"{").await.is_err());
        assert!(e.prioritize(b"[1]").await.is_err());
        let f = filter(&e, br#"{"NodeNames": ["a"]}"#).await;
        assert_eq!(f["Error"], "the request carries no Pod");
    }
}
