//! JSON log lines that lead to their trace: each line carries the
//! OpenTelemetry `trace_id` and `span_id` of the innermost span around the
//! event that is in the trace (hex, as trace backends show them), next to
//! the usual `timestamp`, `level`, `target`, `fields`, the current `span`
//! and the `spans` from the root. Without trace export (no span is in a
//! trace) the two ids are left out.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_opentelemetry::OtelData;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The event format of `CARINA_LOG_FORMAT=json` (span fields formatted by
/// [`JsonFields`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct JsonWithTrace;

impl<S> FormatEvent<S, JsonFields> for JsonWithTrace
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut line = Map::new();
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        line.insert("timestamp".into(), timestamp.into());
        line.insert("level".into(), meta.level().as_str().into());
        let mut fields = Map::new();
        event.record(&mut Fields(&mut fields));
        line.insert("fields".into(), Value::Object(fields));
        line.insert("target".into(), meta.target().into());
        if let Some(scope) = ctx.event_scope() {
            let mut spans = Vec::new();
            let mut ids = None;
            for span in scope.from_root() {
                let extensions = span.extensions();
                let mut object = extensions
                    .get::<FormattedFields<JsonFields>>()
                    .and_then(|f| serde_json::from_str::<Map<String, Value>>(f.as_str()).ok())
                    .unwrap_or_default();
                object.insert("name".into(), span.name().into());
                spans.push(Value::Object(object));
                // From the root inwards: the last one with ids is the
                // innermost span in the trace.
                if let Some(data) = extensions.get::<OtelData>()
                    && let (Some(trace), Some(span_id)) = (data.trace_id(), data.span_id())
                    && trace != opentelemetry::TraceId::INVALID
                {
                    ids = Some((trace, span_id));
                }
            }
            if let Some((trace, span_id)) = ids {
                line.insert("trace_id".into(), trace.to_string().into());
                line.insert("span_id".into(), span_id.to_string().into());
            }
            if let Some(current) = spans.last() {
                line.insert("span".into(), current.clone());
            }
            line.insert("spans".into(), Value::Array(spans));
        }
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// An event's fields as JSON values.
struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0.insert(field.name().into(), value.to_string().into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
}
