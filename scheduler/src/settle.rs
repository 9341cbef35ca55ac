//! The gap between a decision and its first trace in the cache.
//!
//! kube-scheduler runs one scheduling cycle at a time, but it writes the
//! chosen node onto a pod's claims (`volume.kubernetes.io/selected-node`,
//! in its VolumeBinding PreBind) asynchronously, after the cycle has
//! ended. The next pod's `/filter` can arrive before that write reaches
//! the extender's cache, and would then see the first pod's volumes
//! nowhere: a burst over-commits a node.
//!
//! So every `/filter` that passes a pod with claims still waiting for a
//! node records them here, with their `resourceVersion`s. The next
//! `/filter` for a *different* pod with Carina claims first waits — on
//! the cache's change notifications, not by polling — until each
//! recorded pod has settled:
//! - each of its waiting claims changed (a new `resourceVersion`: the
//!   annotation arrived) or is gone, or
//! - the pod has `spec.nodeName`, or the pod the cache had seen is gone
//!   or replaced (another uid),
//!
//! or until the recorded pod's deadline passes (the scheduler may have
//! dropped the pod after the extender answered, e.g. a later plugin
//! refused it; nothing will be written then). The wait costs one API
//! round trip per pod during a burst and nothing otherwise; pods without
//! Carina claims never wait.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::extender::Pod;
use crate::objects::Objects;
use crate::request::ClaimKey;

/// Default bound on one wait.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// Pods that passed `/filter` whose node is not visible yet.
#[derive(Debug)]
pub struct Settle {
    pending: Mutex<Vec<Pending>>,
    timeout: Duration,
}

#[derive(Debug, Clone)]
struct Pending {
    uid: String,
    namespace: String,
    name: String,
    /// Whether the cache had the pod when it was recorded.
    seen: bool,
    claims: Vec<(ClaimKey, Option<String>)>,
    deadline: Instant,
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// Nothing was pending.
    Clear,
    /// Every pending pod settled.
    Settled,
    /// A deadline passed first; the pods not settled were dropped.
    TimedOut,
}

impl Settle {
    /// `timeout` bounds how long a decision is waited for.
    pub fn new(timeout: Duration) -> Self {
        Settle {
            pending: Mutex::new(Vec::new()),
            timeout,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Pending>> {
        // The list stays consistent even if a holder panicked.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Number of pods being waited for.
    pub fn pending(&self) -> usize {
        self.lock().len()
    }

    /// Records that `pod` passed with `claims` waiting for their node.
    pub fn record(
        &self,
        pod: &Pod,
        claims: Vec<(ClaimKey, Option<String>)>,
        objects: &(impl Objects + ?Sized),
    ) {
        if claims.is_empty() {
            return;
        }
        let seen = objects
            .pod(&pod.metadata.namespace, &pod.metadata.name)
            .is_some_and(|p| p.metadata.uid.as_deref() == Some(pod.metadata.uid.as_str()));
        let mut pending = self.lock();
        pending.retain(|p| p.uid != pod.metadata.uid);
        pending.push(Pending {
            uid: pod.metadata.uid.clone(),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            seen,
            claims,
            deadline: Instant::now() + self.timeout,
        });
    }

    /// Waits until every pod recorded, other than `uid`, has settled or
    /// timed out. A record of `uid` itself is dropped: the scheduler asks
    /// again, so its last answer led nowhere.
    pub async fn wait_for_others(&self, uid: &str, objects: &(impl Objects + ?Sized)) -> Waited {
        let mut changes = objects.changes();
        let mut outcome = Waited::Clear;
        loop {
            changes.borrow_and_update();
            let now = Instant::now();
            let next_deadline = {
                let mut pending = self.lock();
                pending.retain(|p| {
                    if p.uid == uid {
                        return false;
                    }
                    if settled(p, objects) {
                        if outcome == Waited::Clear {
                            outcome = Waited::Settled;
                        }
                        return false;
                    }
                    if p.deadline <= now {
                        tracing::warn!(
                            pod = %format!("{}/{}", p.namespace, p.name),
                            "the node chosen for this pod did not show within the settle timeout; deciding without it"
                        );
                        outcome = Waited::TimedOut;
                        return false;
                    }
                    true
                });
                pending.iter().map(|p| p.deadline).min()
            };
            let Some(deadline) = next_deadline else {
                return outcome;
            };
            if outcome == Waited::Clear {
                outcome = Waited::Settled;
            }
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        // The cache is gone: nothing will change any more.
                        self.lock().clear();
                        return Waited::TimedOut;
                    }
                }
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}

fn settled(p: &Pending, objects: &(impl Objects + ?Sized)) -> bool {
    match objects.pod(&p.namespace, &p.name) {
        Some(pod) => {
            if pod.metadata.uid.as_deref() != Some(p.uid.as_str()) {
                return true;
            }
            if pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| !n.is_empty())
            {
                return true;
            }
        }
        None if p.seen => return true,
        None => {}
    }
    p.claims.iter().all(|(key, version)| {
        objects
            .claim(&key.namespace, &key.name)
            .is_none_or(|c| c.metadata.resource_version != *version)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;
    use std::sync::Arc;

    fn waiting(objects: &impl Objects, name: &str) -> Vec<(ClaimKey, Option<String>)> {
        let c = objects.claim("ns", name).expect("claim");
        vec![(
            ClaimKey::new("ns", name),
            c.metadata.resource_version.clone(),
        )]
    }

    #[tokio::test(start_paused = true)]
    async fn waits_until_the_claim_changes() {
        let objects = Arc::new(objects());
        objects.insert_claim(claim("ns", "a", Some("ssd"), "1Gi"));
        let settle = Arc::new(Settle::new(Duration::from_secs(5)));
        assert_eq!(settle.wait_for_others("x", &*objects).await, Waited::Clear);
        settle.record(&pod("ns", "p", &["a"]), waiting(&*objects, "a"), &*objects);
        // The same pod asked again: its old record is dropped.
        assert_eq!(
            settle.wait_for_others("uid-p", &*objects).await,
            Waited::Clear
        );
        settle.record(&pod("ns", "p", &["a"]), waiting(&*objects, "a"), &*objects);

        let writer = {
            let objects = objects.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(30)).await;
                let mut c = selected(claim("ns", "a", Some("ssd"), "1Gi"), "n1");
                c.metadata.resource_version = Some("2".into());
                objects.insert_claim(c);
            })
        };
        let start = Instant::now();
        assert_eq!(
            settle.wait_for_others("uid-q", &*objects).await,
            Waited::Settled
        );
        assert_eq!(start.elapsed(), Duration::from_millis(30));
        assert_eq!(settle.pending(), 0);
        writer.await.expect("writer");
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_at_the_deadline_and_on_a_bound_pod() {
        let objects = objects();
        objects.insert_claim(claim("ns", "a", Some("ssd"), "1Gi"));
        let settle = Settle::new(Duration::from_secs(2));
        settle.record(&pod("ns", "p", &["a"]), waiting(&objects, "a"), &objects);
        let start = Instant::now();
        assert_eq!(
            settle.wait_for_others("uid-q", &objects).await,
            Waited::TimedOut
        );
        assert_eq!(start.elapsed(), Duration::from_secs(2));

        // A pod the cache shows on a node has settled.
        settle.record(&pod("ns", "p", &["a"]), waiting(&objects, "a"), &objects);
        let mut bound = bound_pod("ns", "p", "n1", &["a"]);
        bound.metadata.uid = Some("uid-p".into());
        objects.insert_pod(bound);
        assert_eq!(
            settle.wait_for_others("uid-q", &objects).await,
            Waited::Settled
        );

        // A pod the cache had seen and lost (deleted) has settled.
        settle.record(&pod("ns", "p", &["a"]), waiting(&objects, "a"), &objects);
        objects.remove_pod("ns", "p");
        assert_eq!(
            settle.wait_for_others("uid-q", &objects).await,
            Waited::Settled
        );
    }
}
