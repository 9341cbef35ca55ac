//! Finished OpenTelemetry spans kept in memory, for tests that check what
//! a trace holds.
//!
//! ```ignore
//! let spans = SpanCollector::default();
//! let provider = spans.provider();
//! // ... a subscriber with a layer over provider.tracer("test") ...
//! assert!(spans.flush(&provider).iter().any(|s| s.name == "lvm.lvcreate"));
//! ```

use std::sync::{Arc, Mutex};

use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};

/// A span exporter that keeps every span it is given; clones share them.
#[derive(Debug, Clone, Default)]
pub struct SpanCollector(Arc<Mutex<Vec<SpanData>>>);

impl SpanCollector {
    /// A tracer provider that hands each span to this collector as it
    /// ends.
    pub fn provider(&self) -> SdkTracerProvider {
        SdkTracerProvider::builder()
            .with_simple_exporter(self.clone())
            .build()
    }

    /// Flushes `provider`, then every span exported so far.
    pub fn flush(&self, provider: &SdkTracerProvider) -> Vec<SpanData> {
        provider.force_flush().expect("flush");
        self.0.lock().expect("not poisoned").clone()
    }
}

/// The names of `spans`, for messages.
pub fn names(spans: &[SpanData]) -> Vec<String> {
    spans.iter().map(|s| s.name.to_string()).collect()
}

impl SpanExporter for SpanCollector {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        self.0.lock().expect("not poisoned").extend(batch);
        std::future::ready(Ok(()))
    }
}
