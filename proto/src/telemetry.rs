//! Process telemetry: human (or JSON) logs filtered by `RUST_LOG`, and
//! OpenTelemetry traces exported over OTLP/gRPC when the standard `OTEL_*`
//! variables ask for it.
//!
//! - Logs always go to stderr; `RUST_LOG` filters them (default `info`),
//!   `CARINA_LOG_FORMAT=json` switches to JSON lines, which carry the
//!   `trace_id` and `span_id` of their span's trace ([`JsonWithTrace`]).
//! - Exported spans have a filter of their own, `CARINA_TRACE_FILTER`
//!   (default `info`), so the spans of every external command reach the
//!   trace backend whatever the log shows.
//! - Traces are exported when `OTEL_TRACES_EXPORTER=otlp`, or when it is
//!   unset and `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
//!   `OTEL_EXPORTER_OTLP_ENDPOINT` is set. `OTEL_TRACES_EXPORTER=none`
//!   turns them off. The endpoint defaults to `http://localhost:4317`;
//!   `OTEL_SERVICE_NAME` overrides the service name.
//! - Root spans are sampled as `OTEL_TRACES_SAMPLER` (and
//!   `OTEL_TRACES_SAMPLER_ARG`) say: `always_on`, `always_off`,
//!   `traceidratio`, `parentbased_always_on` (the default),
//!   `parentbased_always_off`, `parentbased_traceidratio`. An unknown
//!   sampler or a ratio outside 0..=1 is refused at start.
//! - Finished spans wait for export in a queue of `OTEL_BSP_MAX_QUEUE_SIZE`
//!   (default 2048) spans; when it is full, or an export fails, spans are
//!   dropped and counted ([`export_metrics`]), never waited for.
//! - The W3C trace-context propagator is installed globally.
//!
//! [`TelemetryConfig::from_lookup`] reads the variables through a function,
//! so tests pass values without touching the process environment.

use std::io::IsTerminal;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
mod export;
mod json;

pub use export::{CountedExporter, ExportMetrics, Places, SpanQueue, export_metrics};
pub use json::JsonWithTrace;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The OTLP/gRPC endpoint used when export is requested without one.
pub const DEFAULT_OTLP_ENDPOINT: &str = "http://localhost:4317";

/// How long dropping a [`TelemetryGuard`] waits for the last spans to go.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Spans waiting for export when `OTEL_BSP_MAX_QUEUE_SIZE` is unset.
pub const DEFAULT_QUEUE_SIZE: usize = 2048;

/// How root spans are chosen for export (`OTEL_TRACES_SAMPLER`); the
/// `ParentBased` ones follow a sampled caller's decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    AlwaysOn,
    AlwaysOff,
    /// This fraction of traces, chosen by trace id.
    Ratio(f64),
    ParentBasedAlwaysOn,
    ParentBasedAlwaysOff,
    ParentBasedRatio(f64),
}

impl Sampling {
    /// The sampler `name` (`OTEL_TRACES_SAMPLER`) with `arg`
    /// (`OTEL_TRACES_SAMPLER_ARG`, the ratio of the ratio samplers,
    /// default 1.0).
    pub fn parse(name: &str, arg: Option<&str>) -> Result<Sampling, TelemetryError> {
        let ratio = || -> Result<f64, TelemetryError> {
            let Some(arg) = arg else { return Ok(1.0) };
            match arg.trim().parse::<f64>() {
                Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
                _ => Err(TelemetryError::Variable {
                    name: "OTEL_TRACES_SAMPLER_ARG",
                    value: arg.to_string(),
                    expected: "a ratio from 0 to 1",
                }),
            }
        };
        Ok(match name.trim() {
            "always_on" => Sampling::AlwaysOn,
            "always_off" => Sampling::AlwaysOff,
            "traceidratio" => Sampling::Ratio(ratio()?),
            "parentbased_always_on" => Sampling::ParentBasedAlwaysOn,
            "parentbased_always_off" => Sampling::ParentBasedAlwaysOff,
            "parentbased_traceidratio" => Sampling::ParentBasedRatio(ratio()?),
            _ => {
                return Err(TelemetryError::Variable {
                    name: "OTEL_TRACES_SAMPLER",
                    value: name.to_string(),
                    expected: "always_on, always_off, traceidratio, parentbased_always_on, \
                               parentbased_always_off or parentbased_traceidratio",
                });
            }
        })
    }

    /// The SDK sampler.
    pub fn sampler(self) -> opentelemetry_sdk::trace::Sampler {
        use opentelemetry_sdk::trace::Sampler;
        let parent = |root: Sampler| Sampler::ParentBased(Box::new(root));
        match self {
            Sampling::AlwaysOn => Sampler::AlwaysOn,
            Sampling::AlwaysOff => Sampler::AlwaysOff,
            Sampling::Ratio(r) => Sampler::TraceIdRatioBased(r),
            Sampling::ParentBasedAlwaysOn => parent(Sampler::AlwaysOn),
            Sampling::ParentBasedAlwaysOff => parent(Sampler::AlwaysOff),
            Sampling::ParentBasedRatio(r) => parent(Sampler::TraceIdRatioBased(r)),
        }
    }
}

/// Errors from setting telemetry up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("RUST_LOG {filter:?}: {source}")]
    Filter {
        filter: String,
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    #[error("OTLP exporter for {endpoint}: {source}")]
    Exporter {
        endpoint: String,
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
    #[error("{name}={value:?}: expected {expected}")]
    Variable {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("a global tracing subscriber is already set: {0}")]
    AlreadySet(#[from] tracing_subscriber::util::TryInitError),
}

/// What [`init_with`] sets up.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    pub service_name: String,
    /// An `EnvFilter` directive string for the log lines (`RUST_LOG`,
    /// default `info`).
    pub log_filter: String,
    /// An `EnvFilter` directive string for the exported spans
    /// (`CARINA_TRACE_FILTER`, default `info`: every RPC, reconcile and
    /// command span).
    pub trace_filter: String,
    pub json_logs: bool,
    /// Where to export traces; `None` exports nothing.
    pub otlp_endpoint: Option<String>,
    /// Which root spans are exported.
    pub sampling: Sampling,
    /// At most this many finished spans wait for export; more are dropped.
    pub queue_size: usize,
}

impl TelemetryConfig {
    /// The configuration the variables given by `lookup` describe; a
    /// sampler or queue size that does not parse is refused, naming the
    /// variable.
    pub fn from_lookup(
        service_name: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, TelemetryError> {
        let var = |k: &str| lookup(k).filter(|v| !v.trim().is_empty());
        let endpoint = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT"));
        let otlp_endpoint = match var("OTEL_TRACES_EXPORTER").as_deref().map(str::trim) {
            Some("none") => None,
            Some("otlp") => Some(endpoint.unwrap_or_else(|| DEFAULT_OTLP_ENDPOINT.to_string())),
            // Unknown exporters (console, zipkin, ...) are not built in.
            Some(_) => None,
            None => endpoint,
        };
        let sampling = match var("OTEL_TRACES_SAMPLER") {
            Some(name) => Sampling::parse(&name, var("OTEL_TRACES_SAMPLER_ARG").as_deref())?,
            None => Sampling::ParentBasedAlwaysOn,
        };
        let queue_size = match var("OTEL_BSP_MAX_QUEUE_SIZE") {
            Some(v) => v.trim().parse::<usize>().ok().filter(|n| *n > 0).ok_or(
                TelemetryError::Variable {
                    name: "OTEL_BSP_MAX_QUEUE_SIZE",
                    value: v,
                    expected: "a positive number of spans",
                },
            )?,
            None => DEFAULT_QUEUE_SIZE,
        };
        Ok(TelemetryConfig {
            service_name: var("OTEL_SERVICE_NAME").unwrap_or_else(|| service_name.to_string()),
            log_filter: var("RUST_LOG").unwrap_or_else(|| "info".to_string()),
            trace_filter: var("CARINA_TRACE_FILTER").unwrap_or_else(|| "info".to_string()),
            json_logs: var("CARINA_LOG_FORMAT").is_some_and(|f| f.eq_ignore_ascii_case("json")),
            otlp_endpoint,
            sampling,
            queue_size,
        })
    }

    /// [`from_lookup`](Self::from_lookup) over the process environment.
    pub fn from_env(service_name: &str) -> Result<Self, TelemetryError> {
        Self::from_lookup(service_name, |k| std::env::var(k).ok())
    }
}

/// Keeps the trace exporter alive; dropping it flushes the spans still
/// buffered (bounded by a few seconds).
#[must_use = "dropping the guard stops trace export"]
#[derive(Debug)]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        let Some(provider) = self.provider.take() else {
            return;
        };
        // Shutdown blocks until the exporter task has flushed; run it off
        // the async worker threads and do not wait forever.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(provider.shutdown());
        });
        match rx.recv_timeout(FLUSH_TIMEOUT) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("trace export shutdown: {e}"),
            Err(_) => eprintln!("trace export shutdown: timed out after {FLUSH_TIMEOUT:?}"),
        }
    }
}

/// [`init_with`] the configuration of the process environment.
pub fn init(service_name: &str) -> Result<TelemetryGuard, TelemetryError> {
    init_with(TelemetryConfig::from_env(service_name)?)
}

/// Installs the global subscriber and propagator. Must run inside a tokio
/// runtime when traces are exported (the exporter runs on it).
pub fn init_with(config: TelemetryConfig) -> Result<TelemetryGuard, TelemetryError> {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let provider = match &config.otlp_endpoint {
        Some(endpoint) => Some(tracer_provider(&config, endpoint)?),
        None => None,
    };
    subscriber(&config, provider.as_ref())?.try_init()?;
    if let (Some(p), Some(endpoint)) = (&provider, &config.otlp_endpoint) {
        opentelemetry::global::set_tracer_provider(p.clone());
        tracing::info!(
            otlp.endpoint = %endpoint,
            service.name = %config.service_name,
            sampling = ?config.sampling,
            queue_size = config.queue_size,
            "exporting traces"
        );
    }
    Ok(TelemetryGuard { provider })
}

/// The subscriber [`init_with`] installs, with spans going to `provider`.
/// Each output has its own filter: the log lines `log_filter`, the traces
/// `trace_filter`, so a quiet log keeps complete traces (command spans are
/// INFO spans and print no log line of their own).
pub fn subscriber(
    config: &TelemetryConfig,
    provider: Option<&SdkTracerProvider>,
) -> Result<impl tracing::Subscriber + Send + Sync + 'static, TelemetryError> {
    subscriber_to(config, provider, std::io::stderr)
}

/// [`subscriber`] with the log lines going to `writer`.
pub fn subscriber_to<W>(
    config: &TelemetryConfig,
    provider: Option<&SdkTracerProvider>,
    writer: W,
) -> Result<impl tracing::Subscriber + Send + Sync + 'static, TelemetryError>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = |directives: &str| {
        EnvFilter::try_new(directives).map_err(|source| TelemetryError::Filter {
            filter: directives.to_string(),
            source,
        })
    };
    let log_filter = filter(&config.log_filter)?;
    let trace_filter = filter(&config.trace_filter)?;
    let otel = provider.map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer(config.service_name.clone()))
            .with_filter(trace_filter)
    });
    let logs = if config.json_logs {
        tracing_subscriber::fmt::layer()
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(JsonWithTrace)
            .with_writer(writer)
            .boxed()
    } else {
        // Colours only for a person at a terminal, not for log collectors.
        tracing_subscriber::fmt::layer()
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(writer)
            .boxed()
    };
    Ok(tracing_subscriber::registry()
        .with(logs.with_filter(log_filter))
        .with(otel))
}

/// The tracer provider `config` asks for: exporting over OTLP/gRPC to its
/// endpoint, sampled and queued as it says; `None` when it exports
/// nothing. Must run inside a tokio runtime.
pub fn otlp_provider(
    config: &TelemetryConfig,
) -> Result<Option<SdkTracerProvider>, TelemetryError> {
    config
        .otlp_endpoint
        .as_deref()
        .map(|endpoint| tracer_provider(config, endpoint))
        .transpose()
}

fn tracer_provider(
    config: &TelemetryConfig,
    endpoint: &str,
) -> Result<SdkTracerProvider, TelemetryError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|source| TelemetryError::Exporter {
            endpoint: endpoint.to_string(),
            source,
        })?;
    Ok(provider_with(config, exporter))
}

/// A tracer provider for `config` exporting through `exporter`: sampled
/// as `config.sampling`, batched on tokio behind a [`SpanQueue`] of
/// `config.queue_size` places.
pub fn provider_with<E>(config: &TelemetryConfig, exporter: E) -> SdkTracerProvider
where
    E: opentelemetry_sdk::trace::SpanExporter + 'static,
{
    let places = Places::new(config.queue_size);
    // The batch processor's own queue (which also carries its flush and
    // shutdown messages) is larger than the SpanQueue's, so it never drops
    // a span the queue let in: every drop is counted there.
    let batch = opentelemetry_sdk::trace::BatchConfigBuilder::default()
        .with_max_queue_size(config.queue_size.saturating_add(64))
        .build();
    // The async-runtime batch processor exports on tokio, which the tonic
    // exporter needs (the default processor's own thread has no reactor).
    let processor = BatchSpanProcessor::builder(
        CountedExporter::new(exporter, places.clone()),
        opentelemetry_sdk::runtime::Tokio,
    )
    .with_batch_config(batch)
    .build();
    SdkTracerProvider::builder()
        .with_sampler(config.sampling.sampler())
        .with_span_processor(SpanQueue::new(processor, places))
        .with_resource(
            Resource::builder()
                .with_service_name(config.service_name.clone())
                .build(),
        )
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    use carina_sys::testkit::{mutated_text, noisy_text};
    use proptest::prelude::*;

    proptest! {
        /// Any sampler name and argument is a sampler or an error naming
        /// the variable; a ratio taken is within 0..=1.
        #[test]
        fn samplers_of_any_text(
            name in prop_oneof![noisy_text(), mutated_text("parentbased_traceidratio")],
            arg in proptest::option::of(prop_oneof![noisy_text(), "[+-]?[0-9]{0,3}(\\.[0-9]{0,20})?([eE][+-]?[0-9]{1,3})?", "(?i)nan|inf|-inf"]),
        ) {
            match Sampling::parse(&name, arg.as_deref()) {
                Ok(Sampling::Ratio(r) | Sampling::ParentBasedRatio(r)) => {
                    prop_assert!((0.0..=1.0).contains(&r), "{}", r);
                }
                Ok(_) => {}
                Err(TelemetryError::Variable { name: var, .. }) => {
                    prop_assert!(var.starts_with("OTEL_TRACES_SAMPLER"));
                }
                Err(e) => prop_assert!(false, "{}", e),
            }
        }
    }

    fn config(vars: &[(&str, &str)]) -> TelemetryConfig {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        TelemetryConfig::from_lookup("carina-node", |k| vars.get(k).cloned()).expect("config")
    }

    /// Log lines written into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Buffer {
        fn lines(&self) -> Vec<serde_json::Value> {
            let bytes = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
            String::from_utf8(bytes)
                .expect("UTF-8")
                .lines()
                .map(|l| serde_json::from_str(l).expect("each line is JSON"))
                .collect()
        }
    }

    #[test]
    fn json_lines_carry_the_trace_and_span_ids() {
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        let c = config(&[("CARINA_LOG_FORMAT", "json")]);
        let provider = SdkTracerProvider::builder().build();
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber =
            subscriber_to(&c, Some(&provider), move || writer.clone()).expect("subscriber");
        let (trace, inner_span) = tracing::subscriber::with_default(subscriber, || {
            tracing::info!("outside any span");
            let outer = tracing::info_span!("reconcile", carina.volume.name = "pvc-1");
            let _o = outer.enter();
            let inner = tracing::info_span!("command", carina.command.line = "lvm lvs");
            let _i = inner.enter();
            tracing::info!(exit_code = 0, ok = true, "command finished");
            let cx = inner.context();
            let span = opentelemetry::trace::TraceContextExt::span(&cx);
            let sc = span.span_context();
            (sc.trace_id().to_string(), sc.span_id().to_string())
        });
        let lines = buffer.lines();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].get("trace_id").is_none(), "no span: {}", lines[0]);
        let line = &lines[1];
        assert_eq!(line["trace_id"], trace.as_str(), "{line}");
        assert_eq!(line["span_id"], inner_span.as_str(), "{line}");
        assert_eq!(trace.len(), 32);
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["fields"]["message"], "command finished");
        assert_eq!(line["fields"]["exit_code"], 0);
        assert_eq!(line["fields"]["ok"], true);
        assert_eq!(line["span"]["name"], "command");
        assert_eq!(line["span"]["carina.command.line"], "lvm lvs");
        assert_eq!(line["spans"][0]["carina.volume.name"], "pvc-1");
        assert!(line["timestamp"].as_str().is_some_and(|t| t.contains('T')));
    }

    #[test]
    fn nothing_set_means_logs_only() {
        let c = config(&[]);
        assert_eq!(c.otlp_endpoint, None);
        assert_eq!(c.log_filter, "info");
        assert_eq!(c.service_name, "carina-node");
        assert!(!c.json_logs);
    }

    #[test]
    fn endpoint_turns_export_on() {
        let c = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")]);
        assert_eq!(c.otlp_endpoint.as_deref(), Some("http://collector:4317"));
        let c = config(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4317"),
        ]);
        assert_eq!(c.otlp_endpoint.as_deref(), Some("http://traces:4317"));
    }

    #[test]
    fn exporter_variable_decides() {
        let c = config(&[("OTEL_TRACES_EXPORTER", "otlp")]);
        assert_eq!(c.otlp_endpoint.as_deref(), Some(DEFAULT_OTLP_ENDPOINT));
        let c = config(&[
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
        ]);
        assert_eq!(c.otlp_endpoint, None);
        let c = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "  ")]);
        assert_eq!(c.otlp_endpoint, None, "blank is unset");
    }

    #[test]
    fn service_name_filter_and_format() {
        let c = config(&[
            ("OTEL_SERVICE_NAME", "node-7"),
            ("RUST_LOG", "carina_node=debug"),
            ("CARINA_LOG_FORMAT", "JSON"),
        ]);
        assert_eq!(c.service_name, "node-7");
        assert_eq!(c.log_filter, "carina_node=debug");
        assert!(c.json_logs);
    }

    #[test]
    fn sampler_variables() {
        assert_eq!(config(&[]).sampling, Sampling::ParentBasedAlwaysOn);
        assert_eq!(config(&[]).queue_size, DEFAULT_QUEUE_SIZE);
        let c = config(&[
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "100"),
        ]);
        assert_eq!(c.sampling, Sampling::Ratio(0.25));
        assert_eq!(c.queue_size, 100);
        assert_eq!(
            config(&[("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")]).sampling,
            Sampling::ParentBasedRatio(1.0),
            "the ratio defaults to 1"
        );
        assert_eq!(
            config(&[("OTEL_TRACES_SAMPLER", "always_off")]).sampling,
            Sampling::AlwaysOff
        );
        assert_eq!(
            config(&[("OTEL_TRACES_SAMPLER", "parentbased_always_off")]).sampling,
            Sampling::ParentBasedAlwaysOff
        );
    }

    #[test]
    fn bad_sampler_variables_are_refused_by_name() {
        let refuse = |vars: &[(&str, &str)]| {
            let vars: HashMap<String, String> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            TelemetryConfig::from_lookup("carina-node", |k| vars.get(k).cloned())
                .expect_err("refused")
                .to_string()
        };
        let e = refuse(&[("OTEL_TRACES_SAMPLER", "jaeger_remote")]);
        assert!(
            e.starts_with("OTEL_TRACES_SAMPLER=\"jaeger_remote\""),
            "{e}"
        );
        for arg in ["1.5", "-0.1", "half", "NaN"] {
            let e = refuse(&[
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", arg),
            ]);
            assert!(e.starts_with("OTEL_TRACES_SAMPLER_ARG="), "{arg}: {e}");
        }
        for size in ["0", "-1", "many"] {
            let e = refuse(&[("OTEL_BSP_MAX_QUEUE_SIZE", size)]);
            assert!(e.starts_with("OTEL_BSP_MAX_QUEUE_SIZE="), "{size}: {e}");
        }
    }
}
