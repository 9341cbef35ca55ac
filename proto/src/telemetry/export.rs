//! The path from a finished span to the trace backend, bounded and
//! counted: a span that finds [`SpanQueue`] full is dropped and counted,
//! never waited for, so a slow or absent collector cannot slow a storage
//! operation; [`CountedExporter`] counts what was exported and what failed.
//!
//! The counts are [`export_metrics`], a registry every binary's `/metrics`
//! page includes (through [`crate::metrics::encode`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The counters of span export, for the process.
#[derive(Debug)]
pub struct ExportMetrics {
    registry: Registry,
    dropped: Counter,
    exported: Counter,
    failed_batches: Counter,
    queued: Gauge,
    /// When an export failure was last logged (ms since `epoch`).
    last_warning_ms: AtomicU64,
    epoch: Instant,
}

/// The process's [`ExportMetrics`].
pub fn export_metrics() -> &'static ExportMetrics {
    static METRICS: OnceLock<ExportMetrics> = OnceLock::new();
    METRICS.get_or_init(ExportMetrics::new)
}

/// At most one log line per this interval about failing exports.
const WARN_EVERY: Duration = Duration::from_secs(60);

impl ExportMetrics {
    fn new() -> Self {
        let mut registry = Registry::default();
        let dropped = Counter::default();
        let exported = Counter::default();
        let failed_batches = Counter::default();
        let queued = Gauge::default();
        registry.register(
            "carina_trace_spans_dropped",
            "Finished spans dropped because the export queue was full or their export failed",
            dropped.clone(),
        );
        registry.register(
            "carina_trace_spans_exported",
            "Spans the trace backend accepted",
            exported.clone(),
        );
        registry.register(
            "carina_trace_export_failures",
            "Span batches whose export failed or timed out",
            failed_batches.clone(),
        );
        registry.register(
            "carina_trace_spans_queued",
            "Finished spans waiting for export",
            queued.clone(),
        );
        ExportMetrics {
            registry,
            dropped,
            exported,
            failed_batches,
            queued,
            last_warning_ms: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
        }
    }

    /// The registry of the counters.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Spans dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }

    /// Spans exported so far.
    pub fn exported(&self) -> u64 {
        self.exported.get()
    }

    /// Failed export batches so far.
    pub fn failed_batches(&self) -> u64 {
        self.failed_batches.get()
    }

    /// Logs an export failure, at most once per [`WARN_EVERY`].
    fn warn(&self, spans: usize, error: &dyn std::fmt::Display) {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.last_warning_ms.load(Ordering::Acquire);
        let due = last == u64::MAX
            || now.saturating_sub(last) >= u64::try_from(WARN_EVERY.as_millis()).unwrap_or(0);
        if due
            && self
                .last_warning_ms
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            tracing::warn!(
                spans,
                error = %error,
                dropped_total = self.dropped(),
                "trace export failed; its spans are dropped (logged at most once a minute)"
            );
        }
    }
}

/// The places of one export queue: spans handed to the batch processor
/// and not yet exported or given up. [`SpanQueue`] takes them,
/// [`CountedExporter`] gives them back.
#[derive(Debug, Clone)]
pub struct Places {
    taken: Arc<AtomicUsize>,
    capacity: usize,
}

impl Places {
    pub fn new(capacity: usize) -> Self {
        Places {
            taken: Arc::new(AtomicUsize::new(0)),
            capacity,
        }
    }

    /// Takes a place; false (and the span counted as dropped) when full.
    fn take(&self) -> bool {
        let capacity = self.capacity;
        let taken = self
            .taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < capacity).then_some(n + 1)
            })
            .is_ok();
        let m = export_metrics();
        if taken {
            m.queued.inc();
        } else {
            m.dropped.inc();
        }
        taken
    }

    /// Gives back `n` places.
    fn give_back(&self, n: usize) {
        let _ = self
            .taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                Some(q.saturating_sub(n))
            });
        export_metrics()
            .queued
            .dec_by(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

/// A span processor that passes at most `places.capacity` finished spans
/// to the `inner` (batch) processor at a time; the rest are dropped and
/// counted. The places come back when [`CountedExporter`] is done with a
/// batch.
#[derive(Debug)]
pub struct SpanQueue<P> {
    inner: P,
    places: Places,
}

impl<P> SpanQueue<P> {
    /// `inner` must hold more than `places.capacity` spans itself, so
    /// that it never drops one this queue let through, and export through
    /// a [`CountedExporter`] of the same `places`.
    pub fn new(inner: P, places: Places) -> Self {
        SpanQueue { inner, places }
    }
}

impl<P: SpanProcessor> SpanProcessor for SpanQueue<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.places.take() {
            self.inner.on_end(span);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// An exporter that counts what `inner` exported and what it failed to,
/// and gives [`SpanQueue`] its places back, also when the batch processor
/// gives up on an export (its timeout drops the future).
#[derive(Debug)]
pub struct CountedExporter<E> {
    inner: E,
    places: Places,
}

impl<E> CountedExporter<E> {
    pub fn new(inner: E, places: Places) -> Self {
        CountedExporter { inner, places }
    }
}

/// Settles one batch when dropped: counted as failed unless `done`.
struct Settle<'a> {
    places: &'a Places,
    spans: usize,
    done: bool,
}

impl Drop for Settle<'_> {
    fn drop(&mut self) {
        self.places.give_back(self.spans);
        let m = export_metrics();
        if !self.done {
            m.failed_batches.inc();
            m.dropped.inc_by(self.spans as u64);
            m.warn(self.spans, &"timed out");
        }
    }
}

impl<E: SpanExporter> SpanExporter for CountedExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let mut settle = Settle {
            places: &self.places,
            spans: batch.len(),
            done: false,
        };
        let result = self.inner.export(batch).await;
        settle.done = true;
        let m = export_metrics();
        match &result {
            Ok(()) => {
                m.exported.inc_by(settle.spans as u64);
            }
            Err(e) => {
                m.failed_batches.inc();
                m.dropped.inc_by(settle.spans as u64);
                m.warn(settle.spans, e);
            }
        }
        result
    }

    fn shutdown_with_timeout(&mut self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&mut self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::{Sampling, TelemetryConfig, provider_with};
    use opentelemetry::trace::{Tracer as _, TracerProvider as _};
    use opentelemetry_sdk::error::OTelSdkError;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use std::sync::Mutex;

    /// What an exporter does with each batch.
    #[derive(Debug, Clone, Copy)]
    enum Behaviour {
        Accept,
        Fail,
        Hang,
    }

    #[derive(Debug, Clone)]
    struct TestExporter {
        behaviour: Behaviour,
        spans: Arc<Mutex<Vec<String>>>,
    }

    impl SpanExporter for TestExporter {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            match self.behaviour {
                Behaviour::Accept => {
                    self.spans
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .extend(batch.into_iter().map(|s| s.name.to_string()));
                    Ok(())
                }
                Behaviour::Fail => Err(OTelSdkError::InternalFailure("collector down".into())),
                Behaviour::Hang => std::future::pending().await,
            }
        }
    }

    fn provider(
        behaviour: Behaviour,
        queue_size: usize,
        sampling: Sampling,
    ) -> (SdkTracerProvider, Arc<Mutex<Vec<String>>>) {
        let mut config =
            TelemetryConfig::from_lookup("carina-test", |_| None).expect("the defaults");
        config.queue_size = queue_size;
        config.sampling = sampling;
        let spans = Arc::new(Mutex::new(Vec::new()));
        let exporter = TestExporter {
            behaviour,
            spans: spans.clone(),
        };
        (provider_with(&config, exporter), spans)
    }

    fn end_spans(provider: &SdkTracerProvider, n: usize) {
        let tracer = provider.tracer("test");
        for i in 0..n {
            drop(tracer.start(format!("op-{i}")));
        }
    }

    /// Flushes off the async workers (the flush blocks on the processor's
    /// task) and gives its outcome.
    async fn flush(provider: &SdkTracerProvider) -> OTelSdkResult {
        let p = provider.clone();
        tokio::task::spawn_blocking(move || p.force_flush())
            .await
            .expect("flush task")
    }

    /// The counters are the process's, so one test goes through every
    /// case in turn, each checked by its exact difference.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn full_queue_and_failed_exports_drop_and_count_spans() {
        let m = export_metrics();

        // A collector that never answers: the first 4 spans wait, the
        // other 6 are dropped at once, and ending them does not block.
        let (before_dropped, before_exported) = (m.dropped(), m.exported());
        let (hung, _) = provider(Behaviour::Hang, 4, Sampling::ParentBasedAlwaysOn);
        end_spans(&hung, 10);
        assert_eq!(m.dropped() - before_dropped, 6, "spans beyond the queue");
        assert_eq!(m.exported(), before_exported);
        // Its shutdown would wait out the export timeout: let it go apart.
        std::thread::spawn(move || drop(hung));

        // A collector that refuses: the batch is counted as failed and its
        // spans as dropped.
        let (before_dropped, before_failed) = (m.dropped(), m.failed_batches());
        let (failing, _) = provider(Behaviour::Fail, 100, Sampling::AlwaysOn);
        end_spans(&failing, 3);
        let _ = flush(&failing).await;
        assert_eq!(m.failed_batches() - before_failed, 1);
        assert_eq!(m.dropped() - before_dropped, 3);

        // A working one: every span is exported, none dropped, and the
        // queue's places come back (more spans than places go through).
        let (before_dropped, before_exported) = (m.dropped(), m.exported());
        let (working, spans) = provider(Behaviour::Accept, 4, Sampling::AlwaysOn);
        for _ in 0..3 {
            end_spans(&working, 4);
            flush(&working).await.expect("flush");
        }
        assert_eq!(m.exported() - before_exported, 12);
        assert_eq!(m.dropped(), before_dropped);
        assert_eq!(spans.lock().expect("spans").len(), 12);

        // Sampled out: nothing queued, exported or dropped.
        let (before_dropped, before_exported) = (m.dropped(), m.exported());
        let (off, spans) = provider(Behaviour::Accept, 4, Sampling::AlwaysOff);
        end_spans(&off, 10);
        flush(&off).await.expect("flush");
        assert!(spans.lock().expect("spans").is_empty());
        assert_eq!(
            (m.dropped(), m.exported()),
            (before_dropped, before_exported)
        );

        // The counters are on the page every binary serves.
        let page = crate::metrics::encode(&Registry::default());
        for name in [
            "carina_trace_spans_dropped_total",
            "carina_trace_spans_exported_total",
            "carina_trace_export_failures_total",
            "carina_trace_spans_queued",
        ] {
            assert!(page.contains(&format!("\n{name} ")), "{name} in {page}");
        }
        assert!(
            page.contains("# TYPE carina_trace_spans_dropped_total counter\n"),
            "{page}"
        );
    }
}
