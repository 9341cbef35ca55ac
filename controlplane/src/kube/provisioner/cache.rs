//! The provisioner's view of the cluster: one watch each on
//! `NodeStorageResource` and `LogicVolume`, started with the provisioner,
//! kept in reflector stores that a create reads instead of listing, and
//! a counter that moves on every `LogicVolume` event so a create can wait
//! for its object's outcome without a watch of its own.
//!
//! **Read your writes.** A store lags the API server by a watch event. So
//! a create chooses its node and *reserves* the room in one step under a
//! lock ([`Cache::reserve`]): the reservation counts as a pending volume
//! for every later choice until the create ends, by which time the store
//! holds the object itself. Concurrent creates in this process therefore
//! never take the same room twice. And the store's word is final only when
//! it places the volume on a published node: a refusal (no node, no room,
//! no such group) or a pinned node it does not know yet is asked again of
//! the API server ([`super::placement::settled`]).
//!
//! The watches run in one task, stopped when the last clone of the
//! provisioner is dropped; watch errors are retried with backoff, and the
//! last one is kept for error messages.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use carina_api::{LogicVolume, NodeStorageResource};
use futures::{FutureExt, StreamExt};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::watch;

/// The stores, the change counter and the reservations.
pub(super) struct Cache {
    lvs: Store<LogicVolume>,
    nsrs: Store<NodeStorageResource>,
    changes: watch::Receiver<u64>,
    reservations: Mutex<HashMap<u64, Arc<LogicVolume>>>,
    next: AtomicU64,
    watch_error: Arc<Mutex<Option<String>>>,
    task: tokio::task::AbortHandle,
}

impl Drop for Cache {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What placement reads: every published record and every volume asked
/// for, reservations included.
pub(super) struct Records {
    pub(super) nsrs: Vec<Arc<NodeStorageResource>>,
    pub(super) lvs: Vec<Arc<LogicVolume>>,
}

/// The room a create holds from its choice until it ends (drop).
pub(super) struct Reservation<'a> {
    cache: &'a Cache,
    id: u64,
}

impl Reservation<'_> {
    /// The object now exists as `created`: the store's copy of it (same
    /// uid) replaces the reservation from when the store has it.
    pub(super) fn created(&self, created: &LogicVolume) {
        if let Some(r) = self.cache.reservations().get_mut(&self.id) {
            *r = Arc::new(created.clone());
        }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.cache.reservations().remove(&self.id);
    }
}

impl Cache {
    /// Starts the watches (on the current Tokio runtime).
    pub(super) fn start(client: Client) -> Cache {
        let (lvs, lv_writer) = reflector::store();
        let (nsrs, nsr_writer) = reflector::store();
        let (tx, changes) = watch::channel(0u64);
        let watch_error = Arc::new(Mutex::new(None));
        let lv_events = watcher(Api::<LogicVolume>::all(client.clone()), Default::default())
            .default_backoff()
            .modify(|lv: &mut LogicVolume| lv.managed_fields_mut().clear())
            .reflect(lv_writer);
        let nsr_events = watcher(Api::<NodeStorageResource>::all(client), Default::default())
            .default_backoff()
            .modify(|nsr: &mut NodeStorageResource| nsr.managed_fields_mut().clear())
            .reflect(nsr_writer);
        let lv_error = watch_error.clone();
        let drive_lvs = drive(lv_events, "LogicVolumes", move |e| {
            *lock(&lv_error) = e;
            tx.send_modify(|n| *n = n.wrapping_add(1));
        });
        let drive_nsrs = drive(nsr_events, "NodeStorageResources", |_| {});
        let task = tokio::spawn(async move {
            tokio::join!(drive_lvs, drive_nsrs);
        })
        .abort_handle();
        Cache::new(lvs, nsrs, changes, watch_error, task)
    }

    /// A cache over stores that `task` keeps current, bumping `changes` on
    /// every `LogicVolume` event.
    fn new(
        lvs: Store<LogicVolume>,
        nsrs: Store<NodeStorageResource>,
        changes: watch::Receiver<u64>,
        watch_error: Arc<Mutex<Option<String>>>,
        task: tokio::task::AbortHandle,
    ) -> Cache {
        Cache {
            lvs,
            nsrs,
            changes,
            reservations: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            watch_error,
            task,
        }
    }

    fn reservations(&self) -> MutexGuard<'_, HashMap<u64, Arc<LogicVolume>>> {
        lock(&self.reservations)
    }

    /// Whether both stores hold their first list (until then the API
    /// server answers instead).
    pub(super) fn is_ready(&self) -> bool {
        let lvs = self.lvs.wait_until_ready().now_or_never();
        let nsrs = self.nsrs.wait_until_ready().now_or_never();
        lvs.is_some_and(|r| r.is_ok()) && nsrs.is_some_and(|r| r.is_ok())
    }

    /// The last error of the `LogicVolume` watch, if its last event was
    /// one.
    pub(super) fn watch_error(&self) -> Option<String> {
        lock(&self.watch_error).clone()
    }

    /// The `LogicVolume` `name` as the store last saw it.
    pub(super) fn lv(&self, name: &str) -> Option<Arc<LogicVolume>> {
        self.lvs.get(&ObjectRef::new(name))
    }

    /// The records from the stores.
    pub(super) fn records(&self) -> Records {
        Records {
            nsrs: self.nsrs.state(),
            lvs: self.lvs.state(),
        }
    }

    /// Chooses with `choose` over the `records` read plus the reservations
    /// of creates in flight (a reservation whose object the records hold,
    /// by uid, is not counted twice), and reserves the room of the object
    /// it returns, in one step: no other choice sees that room before it
    /// is reserved.
    pub(super) fn reserve<T, E>(
        &self,
        records: impl FnOnce() -> Records,
        choose: impl FnOnce(&Records) -> Result<(T, LogicVolume), E>,
    ) -> Result<(T, Reservation<'_>), E> {
        let mut reservations = self.reservations();
        // Read under the lock: a create that ends meanwhile has its object
        // in these records, or its reservation still held.
        let mut records = records();
        let known: HashSet<&str> = records
            .lvs
            .iter()
            .filter_map(|lv| lv.metadata.uid.as_deref())
            .collect();
        let unknown: Vec<Arc<LogicVolume>> = reservations
            .values()
            .filter(|r| {
                r.metadata
                    .uid
                    .as_deref()
                    .is_none_or(|uid| !known.contains(uid))
            })
            .cloned()
            .collect();
        records.lvs.extend(unknown);
        let (chosen, lv) = choose(&records)?;
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        reservations.insert(id, Arc::new(lv));
        Ok((chosen, Reservation { cache: self, id }))
    }

    /// Waits until `judge` returns an outcome for the object `name` with
    /// `uid` as the store shows it, at most `wait`; on the deadline, the
    /// object as last seen. `judge` sees `None` once the object, after the
    /// store had it, is gone or replaced; until the store first has it
    /// (it lags the create by a watch event) there is nothing to judge.
    pub(super) async fn wait_for<T>(
        &self,
        name: &str,
        uid: Option<&str>,
        wait: Duration,
        mut judge: impl FnMut(Option<&LogicVolume>) -> Option<T>,
    ) -> Result<T, Option<Arc<LogicVolume>>> {
        let mut changes = self.changes.clone();
        let mut seen = false;
        let mut last = None;
        let outcome = async {
            loop {
                changes.borrow_and_update();
                let current = self.lv(name);
                let ours = current.filter(|lv| lv.uid().as_deref() == uid);
                match ours {
                    Some(lv) => {
                        seen = true;
                        if let Some(outcome) = judge(Some(&lv)) {
                            return Some(outcome);
                        }
                        last = Some(lv);
                    }
                    None if seen => return judge(None),
                    None => {}
                }
                if changes.changed().await.is_err() {
                    return None;
                }
            }
        };
        match tokio::time::timeout(wait, outcome).await {
            Ok(Some(outcome)) => Ok(outcome),
            Ok(None) | Err(_) => Err(last),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every value behind these locks is replaced whole; none is left
    // half-changed by a panic.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs a reflector's event stream, calling `on_event` with `None` after
/// each event and with the error after each watch error.
async fn drive<K, S>(events: S, what: &'static str, mut on_event: impl FnMut(Option<String>))
where
    K: Resource,
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(_) => on_event(None),
            Err(e) => {
                tracing::warn!(error = %e, "watching {what} failed; retrying");
                on_event(Some(e.to_string()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::provisioner::fixtures::{MIB, lv};
    use carina_api::LogicVolumeStatus;
    use kube::runtime::reflector::store::Writer;

    /// What the test writes into a cache's `LogicVolume` store, as the
    /// watch would.
    struct Feed {
        lvs: Writer<LogicVolume>,
        changes: watch::Sender<u64>,
    }

    impl Feed {
        fn apply(&mut self, lv: LogicVolume) {
            self.lvs.apply_watcher_event(&watcher::Event::Apply(lv));
            self.changes.send_modify(|n| *n += 1);
        }

        fn delete(&mut self, lv: LogicVolume) {
            self.lvs.apply_watcher_event(&watcher::Event::Delete(lv));
            self.changes.send_modify(|n| *n += 1);
        }
    }

    /// A cache with both stores listed (empty), and its feed.
    fn cache() -> (Cache, Feed) {
        let (lv_store, mut lvs) = reflector::store();
        let (nsr_store, mut nsrs) = reflector::store::<NodeStorageResource>();
        lvs.apply_watcher_event(&watcher::Event::InitDone);
        nsrs.apply_watcher_event(&watcher::Event::InitDone);
        let (tx, changes) = watch::channel(0);
        let task = tokio::spawn(async {}).abort_handle();
        let cache = Cache::new(lv_store, nsr_store, changes, Arc::default(), task);
        (cache, Feed { lvs, changes: tx })
    }

    fn pending() -> LogicVolume {
        let mut lv = lv("a", "ssd", 8 * MIB);
        lv.metadata.uid = None;
        lv
    }

    /// How many volumes a choice sees, reserving `lv`.
    fn reserve_seeing(cache: &Cache, lv: LogicVolume) -> (usize, Reservation<'_>) {
        cache
            .reserve(
                || cache.records(),
                |records| Ok::<_, ()>((records.lvs.len(), lv)),
            )
            .expect("chosen")
    }

    #[tokio::test]
    async fn a_reservation_counts_until_the_create_ends_and_never_twice() {
        let (cache, mut feed) = cache();
        assert!(cache.is_ready());
        let (seen, first) = reserve_seeing(&cache, pending());
        assert_eq!(seen, 0);
        // The next choice sees the first one's room taken.
        let (seen, second) = reserve_seeing(&cache, pending());
        assert_eq!(seen, 1);
        drop(second);
        // Created (uid u1), then in the store: counted once.
        let made = lv("a", "ssd", 8 * MIB);
        first.created(&made);
        let (seen, _) = reserve_seeing(&cache, pending());
        assert_eq!(seen, 1, "the reservation, not yet in the store");
        feed.apply(made);
        let (seen, _) = reserve_seeing(&cache, pending());
        assert_eq!(seen, 1, "the store's copy stands for the reservation");
        drop(first);
        let (seen, _) = reserve_seeing(&cache, pending());
        assert_eq!(seen, 1, "the store's copy stays");
        // A refusal reserves nothing.
        let refused = cache.reserve(|| cache.records(), |_| Err::<((), LogicVolume), _>("no"));
        assert!(refused.is_err());
        let (seen, _) = reserve_seeing(&cache, pending());
        assert_eq!(seen, 1);
    }

    #[tokio::test]
    async fn waiting_judges_the_object_once_the_store_has_it() {
        let (cache, mut feed) = cache();
        // An older object of the same name (another uid): not ours yet.
        let mut older = lv("a", "ssd", 8 * MIB);
        older.metadata.uid = Some("u0".into());
        feed.apply(older);
        let judged = std::sync::Mutex::new(Vec::new());
        let wait = cache.wait_for("pvc-1", Some("u1"), Duration::from_secs(5), |obj| {
            let made = obj.map(|lv| lv.status.is_some());
            judged.lock().expect("judged").push(made);
            match made {
                Some(true) => Some("made"),
                Some(false) => None,
                None => Some("gone"),
            }
        });
        let mut wait = std::pin::pin!(wait);
        assert!(futures::poll!(wait.as_mut()).is_pending());
        let mut ours = lv("a", "ssd", 8 * MIB);
        feed.apply(ours.clone());
        assert!(futures::poll!(wait.as_mut()).is_pending());
        ours.status = Some(LogicVolumeStatus {
            volume_id: Some("pvc-1".into()),
            ..LogicVolumeStatus::default()
        });
        feed.apply(ours);
        assert_eq!(wait.await, Ok("made"));
        assert_eq!(
            *judged.lock().expect("judged"),
            [Some(false), Some(true)],
            "judged only once the store had that uid"
        );
    }

    #[tokio::test]
    async fn an_object_gone_after_it_was_seen_is_judged_gone() {
        let (cache, mut feed) = cache();
        let ours = lv("a", "ssd", 8 * MIB);
        feed.apply(ours.clone());
        let wait = cache.wait_for("pvc-1", Some("u1"), Duration::from_secs(5), |obj| {
            obj.is_none().then_some("gone")
        });
        let mut wait = std::pin::pin!(wait);
        assert!(futures::poll!(wait.as_mut()).is_pending());
        feed.delete(ours);
        assert_eq!(wait.await, Ok("gone"));
    }

    #[tokio::test]
    async fn the_deadline_returns_the_object_as_last_seen() {
        let (cache, mut feed) = cache();
        feed.apply(lv("a", "ssd", 8 * MIB));
        let last = cache
            .wait_for(
                "pvc-1",
                Some("u1"),
                Duration::from_millis(20),
                |_| None::<()>,
            )
            .await
            .expect_err("no outcome");
        assert_eq!(last.and_then(|lv| lv.uid()).as_deref(), Some("u1"));
        let never = cache
            .wait_for("other", None, Duration::from_millis(20), |_| Some(()))
            .await
            .expect_err("never in the store");
        assert!(never.is_none(), "an object never seen is not judged gone");
    }
}
