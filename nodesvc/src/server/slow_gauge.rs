//! A `/metrics` figure that takes waiting to read, read beside the page
//! rather than on its path. The IO limits in force are one: counting them
//! lists the node's volumes, which on an LVM group runs `lvm pvs` (it
//! waits for the volume group's lvm lock, held for as long as a hung
//! lvcreate runs) and reads the engine's group table (it waits while a
//! configuration change waits for a group's lock).
//!
//! A scrape starts a read unless one is already running (never more than
//! one at a time, however many scrapes come), waits for a read to end
//! until the running read is as old as the page's bound, and renders the
//! last successful reading with its age: one scrape during a hang waits
//! the bound, the next ones answer at once. A read that hangs runs on to
//! its command's own time limit, never to a scrape's; a failed read keeps
//! the last reading, which grows older.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::Instrument as _;

/// A figure as last read (a count by default; any value a read makes,
/// such as a table of counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading<T = usize> {
    /// The value read.
    pub value: T,
    /// How long ago it was read.
    pub age: Duration,
}

#[derive(Debug, Clone, Copy)]
struct State<T> {
    /// The last successful read: its value and when it ended.
    last: Option<(T, Instant)>,
    /// Reads ended, successful or not (a waiting scrape wakes on each).
    ended: u64,
}

impl<T> Default for State<T> {
    fn default() -> Self {
        State {
            last: None,
            ended: 0,
        }
    }
}

/// One figure read beside the page; see the module documentation.
#[derive(Debug)]
pub struct SlowGauge<T = usize> {
    /// Span name of a read, e.g. `metrics.io_limits`.
    name: &'static str,
    /// When the running read started; `None` while none runs.
    reading: Mutex<Option<Instant>>,
    state: watch::Sender<State<T>>,
}

impl<T: Clone + Send + Sync + 'static> SlowGauge<T> {
    /// A gauge whose reads are traced as `name`.
    pub fn new(name: &'static str) -> SlowGauge<T> {
        SlowGauge {
            name,
            reading: Mutex::new(None),
            state: watch::Sender::new(State::default()),
        }
    }

    /// The figure for a page now: starts `read` on its own task unless a
    /// read is running (then `read` is dropped unstarted), waits for a
    /// read to end until the running one is `wait` old, and returns the
    /// last successful reading; `None` before the first. `read` answers
    /// `None` when it failed.
    pub async fn get<F>(self: &Arc<Self>, read: F, wait: Duration) -> Option<Reading<T>>
    where
        F: Future<Output = Option<T>> + Send + 'static,
    {
        let mut ended = self.state.subscribe();
        ended.borrow_and_update();
        // When the read this page waits for started, and whether it is
        // this page's own.
        let (started, own) = {
            let mut reading = self.reading.lock().unwrap_or_else(|p| p.into_inner());
            match *reading {
                Some(started) => (started, false),
                None => (*reading.insert(Instant::now()), true),
            }
        };
        if own {
            let gauge = self.clone();
            let span = tracing::debug_span!("metrics.read", carina.metric = gauge.name);
            tokio::spawn(
                async move {
                    let value = read.await;
                    // Free before the news: a page that comes between
                    // starts its own read instead of waiting for none.
                    *gauge.reading.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    let failed = value.is_none();
                    gauge.state.send_modify(|s| {
                        if let Some(value) = value {
                            s.last = Some((value, Instant::now()));
                        }
                        s.ended += 1;
                    });
                    if failed {
                        tracing::debug!("the read failed; the last reading stays");
                    }
                }
                .instrument(span),
            );
        }
        let left = wait.saturating_sub(started.elapsed());
        if tokio::time::timeout(left, ended.changed()).await.is_err() {
            tracing::debug!(
                carina.metric = self.name,
                ?wait,
                "a read runs on; the last reading is rendered"
            );
        }
        self.last()
    }

    /// The last successful reading, without reading.
    pub fn last(&self) -> Option<Reading<T>> {
        self.state
            .borrow()
            .last
            .as_ref()
            .map(|(value, at)| Reading {
                value: value.clone(),
                age: at.elapsed(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The bound of the pages below; an answer at once comes far sooner.
    const WAIT: Duration = Duration::from_secs(1);

    #[tokio::test]
    async fn a_quick_read_is_rendered_fresh() {
        let g = Arc::new(SlowGauge::<usize>::new("test"));
        let got = g.get(async { Some(3) }, Duration::from_secs(60)).await;
        assert_eq!(got.map(|r| r.value), Some(3));
        assert!(
            got.is_some_and(|r| r.age < Duration::from_secs(1)),
            "{got:?}"
        );
        let got = g.get(async { Some(4) }, Duration::from_secs(60)).await;
        assert_eq!(got.map(|r| r.value), Some(4), "each page reads again");
    }

    #[tokio::test]
    async fn a_hung_read_costs_a_page_the_wait_and_leaves_the_last_reading() {
        let g = Arc::new(SlowGauge::<usize>::new("test"));
        assert_eq!(g.get(async { None }, WAIT).await, None, "nothing read yet");
        g.get(async { Some(2) }, Duration::from_secs(60)).await;
        let started = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let hung = {
            let started = started.clone();
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                let _ = released.await;
                Some(9)
            }
        };
        let t = Instant::now();
        let got = g.get(hung, WAIT).await.expect("the last reading");
        let took = t.elapsed();
        assert_eq!(got.value, 2);
        assert!(got.age >= WAIT, "its age shows it is old: {got:?}");
        assert!(
            took >= WAIT && took < Duration::from_secs(10),
            "the page waited {took:?}"
        );
        // Later pages start no second read while the first hangs, and
        // answer at once: the hung read is older than the bound.
        for _ in 0..3 {
            let other = {
                let started = started.clone();
                async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    Some(100)
                }
            };
            let t = Instant::now();
            assert_eq!(g.get(other, WAIT).await.map(|r| r.value), Some(2));
            assert!(t.elapsed() < WAIT, "waited {:?}", t.elapsed());
        }
        assert_eq!(started.load(Ordering::SeqCst), 1, "one read at a time");
        // The hung read ends: its value is the next page's.
        release.send(()).expect("the read waits");
        let mut ended = g.state.subscribe();
        tokio::time::timeout(
            Duration::from_secs(10),
            ended.wait_for(|s| s.last.is_some_and(|(v, _)| v == 9)),
        )
        .await
        .expect("the released read ends")
        .expect("the gauge lives");
        assert_eq!(g.last().map(|r| r.value), Some(9));
        assert_eq!(
            g.get(async { Some(5) }, WAIT).await.map(|r| r.value),
            Some(5)
        );
    }

    #[tokio::test]
    async fn a_failed_read_keeps_the_last_reading() {
        let g = Arc::new(SlowGauge::<usize>::new("test"));
        g.get(async { Some(1) }, Duration::from_secs(60)).await;
        let t = Instant::now();
        let got = g.get(async { None }, Duration::from_secs(60)).await;
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "a failure ends the wait"
        );
        assert_eq!(got.map(|r| r.value), Some(1));
    }
}
