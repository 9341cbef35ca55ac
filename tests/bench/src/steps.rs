//! Where a request's time goes: a tracing layer that records when each
//! span of Carina's crates (and each Kubernetes API request) opens and
//! closes, with the volume it works on, and a timeline of the steps of one
//! kind of request: for each step the median offset of its start and end
//! from the start of the request, its median duration, how often it ran
//! per request, and the sum of its durations (in a burst, the time a step
//! that runs one at a time kept its resource busy).
//!
//! Spans carry the volume as the field `carina.volume.name`, or inherit it from
//! their parent; a span named by `otel.name` is reported under that name
//! (`backend` → `lvm.create`), a kube API request as `http <verb>`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use carina_proto::telemetry::{self, TelemetryConfig};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::time::Instant;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::FilterExt as _;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One closed span.
#[derive(Debug, Clone)]
pub struct Step {
    pub name: String,
    pub volume: Option<String>,
    pub start: Instant,
    pub end: Instant,
}

static CLOSED: Mutex<Vec<Step>> = Mutex::new(Vec::new());

/// Whether spans are exported now ([`set_export`]).
static EXPORT_ON: AtomicBool = AtomicBool::new(false);

/// The trace export of the process: its provider (OTLP/gRPC to
/// `127.0.0.1:<port>`, built as a production binary builds it) and port.
static EXPORT: OnceLock<(SdkTracerProvider, u16)> = OnceLock::new();

/// Turns trace export on or off for the spans opened from now on. While
/// off, a span costs the export layer one filter check.
pub fn set_export(on: bool) {
    EXPORT_ON.store(on, Ordering::Release);
}

/// The port the exporter sends to (where a collector should listen) and
/// its provider, once [`install`] has run.
pub fn export() -> Option<&'static (SdkTracerProvider, u16)> {
    EXPORT.get()
}

/// The exporting provider a production binary would build for an OTLP
/// endpoint on a free loopback port, sampling every trace.
fn export_provider() -> anyhow::Result<(SdkTracerProvider, u16)> {
    let port = carina_tests::ports::free_port()?;
    let config = TelemetryConfig::from_lookup("carina-bench", |k| match k {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some(format!("http://127.0.0.1:{port}")),
        "OTEL_TRACES_SAMPLER" => Some("always_on".to_string()),
        _ => None,
    })?;
    let provider = telemetry::otlp_provider(&config)?
        .ok_or_else(|| anyhow::anyhow!("an endpoint was given"))?;
    Ok((provider, port))
}

/// Installs the recorder as the process's subscriber (once; later calls do
/// nothing), with an OpenTelemetry layer (the production trace filter,
/// `info`) that [`set_export`] switches on and off (off at first). Runs
/// inside a tokio runtime (the exporter's).
pub fn install() {
    let targets = Targets::new()
        .with_target("carina_controlplane", Level::INFO)
        .with_target("carina_csi", Level::INFO)
        .with_target("carina_node", Level::INFO)
        .with_target("carina_sys", Level::INFO)
        .with_target("carina_proto", Level::INFO)
        .with_target("carina_api", Level::DEBUG)
        .with_target("kube_client", Level::DEBUG);
    if EXPORT.get().is_some() {
        return;
    }
    let (provider, port) = match export_provider() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("steps: no trace export: {e:#}");
            return;
        }
    };
    let switch =
        tracing_subscriber::filter::dynamic_filter_fn(|_, _| EXPORT_ON.load(Ordering::Acquire));
    let otel = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("carina-bench"))
        .with_filter(EnvFilter::new("info").and(switch));
    let subscriber = tracing_subscriber::registry()
        .with(Recorder.with_filter(targets))
        .with(otel);
    if tracing::subscriber::set_global_default(subscriber).is_ok() {
        let _ = EXPORT.set((provider, port));
    }
}

/// The spans closed since the last call.
pub fn take() -> Vec<Step> {
    std::mem::take(&mut *CLOSED.lock().unwrap_or_else(PoisonError::into_inner))
}

/// The timeline of the requests whose root span is named `root`: one line
/// per step of the same volume, by median start offset.
pub fn timeline(steps: &[Step], root: &str) -> String {
    let roots: HashMap<&str, &Step> = steps
        .iter()
        .filter(|s| s.name == root)
        .filter_map(|s| Some((s.volume.as_deref()?, s)))
        .collect();
    let mut by_name: HashMap<&str, Vec<(f64, f64)>> = HashMap::new();
    for s in steps {
        let Some(r) = s.volume.as_deref().and_then(|v| roots.get(v)) else {
            continue;
        };
        // Only what happened while the request ran.
        if s.start < r.start || s.start > r.end {
            continue;
        }
        let ms = |t: Instant| t.duration_since(r.start).as_secs_f64() * 1000.0;
        by_name
            .entry(&s.name)
            .or_default()
            .push((ms(s.start), ms(s.end)));
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let mut rows: Vec<(f64, String)> = by_name
        .into_iter()
        .map(|(name, spans)| {
            let per = spans.len() as f64 / roots.len().max(1) as f64;
            let start = median(spans.iter().map(|s| s.0).collect());
            let end = median(spans.iter().map(|s| s.1).collect());
            let took = median(spans.iter().map(|s| s.1 - s.0).collect());
            let total: f64 = spans.iter().map(|s| s.1 - s.0).sum::<f64>() / 1000.0;
            let line = format!(
                "  {name:<40} start {start:>8.2}  end {end:>8.2}  took {took:>8.2} ms  ×{per:.2}  Σ {total:>7.2} s"
            );
            (start, line)
        })
        .collect();
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out = format!("steps of {root} ({} requests, medians):\n", roots.len());
    for (_, line) in rows {
        let _ = writeln!(out, "{line}");
    }
    out
}

struct Recorder;

/// What an open span keeps until it closes.
struct Open {
    name: String,
    volume: Option<String>,
    start: Instant,
}

#[derive(Default)]
struct Fields {
    otel_name: Option<String>,
    volume: Option<String>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let text = || format!("{value:?}").trim_matches('"').to_string();
        match field.name() {
            "otel.name" => self.otel_name = Some(text()),
            "carina.volume.name" => self.volume = Some(text()),
            _ => {}
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "otel.name" => self.otel_name = Some(value.to_string()),
            "carina.volume.name" => self.volume = Some(value.to_string()),
            _ => {}
        }
    }
}

impl<S> Layer<S> for Recorder
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let meta = attrs.metadata().name();
        let name = match (meta, fields.otel_name) {
            ("HTTP", Some(verb)) => format!("http {verb}"),
            (_, Some(name)) => name,
            (meta, None) => meta.to_string(),
        };
        let volume = fields.volume.or_else(|| {
            let parent = span.parent()?;
            let ext = parent.extensions();
            ext.get::<Open>()?.volume.clone()
        });
        span.extensions_mut().insert(Open {
            name,
            volume,
            start: Instant::now(),
        });
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let ext = span.extensions();
        let Some(open) = ext.get::<Open>() else {
            return;
        };
        let step = Step {
            name: open.name.clone(),
            volume: open.volume.clone(),
            start: open.start,
            end: Instant::now(),
        };
        CLOSED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(step);
    }
}
