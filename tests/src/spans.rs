//! Finished OpenTelemetry spans kept in memory, for tests that check what
//! a trace holds.
//!
//! ```ignore
//! let spans = SpanCollector::default();
//! let provider = spans.provider();
//! // ... a subscriber with a layer over provider.tracer("test") ...
//! provider.force_flush()?;
//! assert!(spans.finished().iter().any(|s| s.name == "lvm.lvcreate"));
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

    /// The spans exported so far (flush the provider first).
    pub fn finished(&self) -> Vec<SpanData> {
        self.0.lock().expect("not poisoned").clone()
    }
}

impl SpanExporter for SpanCollector {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        self.0.lock().expect("not poisoned").extend(batch);
        std::future::ready(Ok(()))
    }
}
