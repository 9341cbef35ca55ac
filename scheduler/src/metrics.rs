//! The extender's Prometheus metrics, served at `GET /metrics` beside its
//! verbs: how long each answer took, by verb and HTTP status, and how many
//! volumes the last reservation count held in flight. No claim, pod or
//! node names in labels.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The labels of one answer.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Answer {
    /// `filter`, `prioritize`, or `other` (probes, unknown paths).
    verb: &'static str,
    /// The HTTP status code.
    code: u16,
}

/// The extender's metrics and the registry they are encoded from.
#[derive(Debug)]
pub struct ExtenderMetrics {
    registry: Registry,
    answers: Family<Answer, Histogram>,
    in_flight: Gauge,
}

impl Default for ExtenderMetrics {
    fn default() -> Self {
        let answers = Family::<Answer, Histogram>::new_with_constructor(|| {
            // 0.5 ms to about 4 s.
            Histogram::new(exponential_buckets(0.0005, 2.0, 14))
        });
        let in_flight = Gauge::default();
        let mut registry = Registry::with_prefix("carina_extender");
        registry.register_with_unit(
            "request_duration",
            "Time to answer one request, by verb and HTTP status",
            prometheus_client::registry::Unit::Seconds,
            answers.clone(),
        );
        registry.register(
            "reservations_in_flight",
            "Volumes promised to nodes but not yet counted by their capacity records, at the last count",
            in_flight.clone(),
        );
        ExtenderMetrics {
            registry,
            answers,
            in_flight,
        }
    }
}

impl ExtenderMetrics {
    /// Records one answer to `verb` with `code`, `seconds` after the
    /// request came in.
    pub fn observe(&self, verb: &str, code: u16, seconds: f64) {
        let verb = match verb {
            "filter" => "filter",
            "prioritize" => "prioritize",
            _ => "other",
        };
        self.answers
            .get_or_create(&Answer { verb, code })
            .observe(seconds);
    }

    /// The number of volumes in flight at the latest count.
    pub fn set_in_flight(&self, volumes: usize) {
        self.in_flight
            .set(i64::try_from(volumes).unwrap_or(i64::MAX));
    }

    /// The exposition text ([`carina_proto::metrics::encode`]).
    pub fn encode(&self) -> String {
        carina_proto::metrics::encode(&self.registry)
    }
}

/// The content type of [`ExtenderMetrics::encode`].
pub use carina_proto::metrics::CONTENT_TYPE;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_parses_with_the_names_and_labels_it_promises() {
        let m = ExtenderMetrics::default();
        m.observe("filter", 200, 0.003);
        m.observe("filter", 200, 0.004);
        m.observe("prioritize", 400, 0.001);
        m.observe("pvc-0001", 404, 0.001);
        m.set_in_flight(3);
        let text = m.encode();
        let lines = text.lines().map(|l| Ok(l.to_string()));
        let scrape = prometheus_parse::Scrape::parse(lines).expect("parses");
        let count = scrape
            .samples
            .iter()
            .find(|s| {
                s.metric == "carina_extender_request_duration_seconds_count"
                    && s.labels.get("verb") == Some("filter")
                    && s.labels.get("code") == Some("200")
            })
            .expect("filter count");
        assert!(
            matches!(count.value, prometheus_parse::Value::Untyped(v) | prometheus_parse::Value::Counter(v) if v == 2.0),
            "{count:?}"
        );
        let verbs: std::collections::BTreeSet<&str> = scrape
            .samples
            .iter()
            .filter_map(|s| s.labels.get("verb"))
            .collect();
        assert_eq!(
            verbs.into_iter().collect::<Vec<_>>(),
            ["filter", "other", "prioritize"],
            "no unbounded label values"
        );
        let gauge = scrape
            .samples
            .iter()
            .find(|s| s.metric == "carina_extender_reservations_in_flight")
            .expect("gauge");
        assert!(
            matches!(gauge.value, prometheus_parse::Value::Gauge(v) if v == 3.0),
            "{gauge:?}"
        );
    }
}
